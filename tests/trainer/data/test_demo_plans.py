"""Plans from demonstrations: each row's actions and those that followed it in its
episode, found by observation, in whatever order the rows were recorded."""

import torch

from trainer.data.demo_plans import plan_targets, successors
from trainer.data.demos import record_demos
from trainer.envs.builtin_reach import BuiltinReachEnv
from trainer.envs.intervention import ScriptedReachOperator


def episode(start: float, length: int) -> dict[str, torch.Tensor]:
    obs = torch.arange(length + 1, dtype=torch.float32)[:, None] + start
    return {
        "obs": obs[:-1],
        "next_obs": obs[1:],
        "action": obs[:-1].repeat(1, 2),
        "terminal": torch.arange(length) == length - 1,
    }


def test_rows_in_any_order_chain_into_their_episodes_plans():
    a, b = episode(0.0, 3), episode(100.0, 2)
    rows = {name: torch.cat([a[name], b[name]]) for name in a}
    shuffled = torch.tensor([4, 0, 3, 2, 1])
    rows = {name: tensor[shuffled] for name, tensor in rows.items()}
    assert successors(rows).tolist() == [-1, 4, 0, -1, 3]
    actions, valid = plan_targets(rows, max_horizon=3)
    assert actions[1, :, 0].tolist() == [0.0, 1.0, 2.0] and valid[1].all()  # a's first row
    assert actions[4, :, 0].tolist() == [1.0, 2.0, 2.0] and valid[4].tolist() == [1, 1, 0]
    assert actions[0, :, 0].tolist() == [101.0] * 3 and valid[0].tolist() == [1, 0, 0]


def test_recorded_image_demos_chain_every_step_of_their_episodes():
    env = BuiltinReachEnv(4, vision_language=True, image_size=16)
    operator = ScriptedReachOperator(4, state=env.state_observation)
    demos = record_demos(env, operator, task_ids=[0])
    following = successors(demos)
    # Each successful episode ends in one terminal row; every other row has a successor.
    assert int(demos["terminal"].sum()) >= 1
    assert ((following >= 0) == ~demos["terminal"]).all()
    actions, valid = plan_targets(demos, max_horizon=5)
    assert torch.equal(actions[:, 0], demos["action"]) and valid[:, 0].all()
