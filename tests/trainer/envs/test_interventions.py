"""Interventions at the trainer level and demo files (seed 004)."""

import numpy as np
import pytest
import torch

from trainer.data.demos import DemoFileError, load_demos, record_demos, save_demos
from trainer.data.replay import ReplayBuffer, add_transitions, transition_batch
from trainer.envs.builtin_reach import BuiltinReachEnv
from trainer.envs.intervention import InterventionEnv, ScriptedReachOperator


def test_the_source_replaces_the_policys_action_only_where_it_takes_over():
    env = BuiltinReachEnv(4, seed=1)
    operator = ScriptedReachOperator(4, share=0.5, seed=1)
    wrapped = InterventionEnv(env, operator)
    obs = wrapped.reset(0, env.init_states(0)[:4])
    policy = torch.full((4, 7), 0.25)
    step = wrapped.step(policy)
    human = ScriptedReachOperator(4, share=1.0).act(obs, torch.zeros(4, dtype=torch.long)).actions
    assert step.intervened.tolist() == operator.chosen.tolist()
    assert 0 < int(step.intervened.sum()) < 4  # this seed picks some copies, not all
    assert not step.held.any()  # the scripted operator always gives input
    expected = torch.where(step.intervened[:, None], human, policy)
    torch.testing.assert_close(step.applied_actions, expected)


def test_the_operator_holds_only_for_its_step_budget_and_redraws_per_episode():
    env = BuiltinReachEnv(8, seed=0, max_episode_steps=6)
    wrapped = InterventionEnv(env, ScriptedReachOperator(8, share=1.0, max_steps=2))
    wrapped.reset(0, env.init_states(0)[:8])
    flags = []
    for _ in range(3):
        flags.append(wrapped.step(torch.zeros(8, 7)).intervened.clone())
    assert flags[0].all() and flags[1].all()
    not_restarted = wrapped.episode_step > 0
    assert not (flags[2] & not_restarted).any()


def test_steering_to_the_goal_solves_every_task():
    env = BuiltinReachEnv(16, seed=0)
    demos = record_demos(env, ScriptedReachOperator(16), task_ids=list(range(6)),
                         successful_only=False)  # fmt: skip
    successes = int(demos["terminal"].sum())
    assert successes == 6 * 16  # every episode ends in success
    assert demos["intervened"].all()


def test_intervened_steps_reach_both_buffers_from_a_running_env():
    env = BuiltinReachEnv(6, seed=2)
    wrapped = InterventionEnv(env, ScriptedReachOperator(6, share=0.5, seed=1))
    online, demo = ReplayBuffer(1000), ReplayBuffer(1000)
    obs = wrapped.reset(1, env.init_states(1)[:6])
    intervened = 0
    for _ in range(20):
        actions = torch.rand(6, 7) * 2 - 1
        step = wrapped.step(actions)
        intervened += int(step.intervened.sum())
        add_transitions(online, demo, transition_batch(obs, actions, step))
        obs = step.obs
    assert len(online) == 120 and len(demo) == intervened > 0
    assert demo.ordered()["intervened"].all()


def test_a_time_out_keeps_its_true_final_observation_and_is_not_terminal():
    env = BuiltinReachEnv(2, seed=0, max_episode_steps=1)
    obs = env.reset(0, env.init_states(0)[:2])
    actions = torch.full((2, 7), -1.0)  # moves away from the reset position
    step = env.step(actions)
    row = transition_batch(obs, actions, step)
    assert step.truncated.all() and not row["terminal"].any()
    torch.testing.assert_close(row["next_obs"], step.final_observation)
    torch.testing.assert_close(step.obs, obs)  # the copies have restarted
    assert not torch.equal(row["next_obs"], step.obs)


def test_a_demo_file_round_trips(tmp_path):
    env = BuiltinReachEnv(4, seed=0)
    demos = record_demos(env, ScriptedReachOperator(4), task_ids=[0, 3], rounds=2)
    path = save_demos(tmp_path / "reach.npz", demos)  # another name writes a LeRobot dataset
    loaded = load_demos(path)
    assert set(loaded) == set(demos)
    for name in demos:
        assert torch.equal(loaded[name], demos[name]), name
    assert int(loaded["terminal"].sum()) == 2 * 2 * 4  # one success per episode


def test_a_file_without_intervened_counts_as_human_actions(tmp_path):
    rows = 3
    np.savez(
        tmp_path / "d.npz", format_version=1, obs=np.zeros((rows, 2)), action=np.zeros((rows, 1)),
        reward=np.zeros(rows), next_obs=np.zeros((rows, 2)), terminal=np.zeros(rows, bool),
    )  # fmt: skip
    loaded = load_demos(tmp_path / "d.npz")
    assert loaded["intervened"].all() and loaded["obs"].dtype == torch.float32


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"obs": np.zeros((2, 2))}, "missing arrays action, reward, next_obs, terminal"),
        ({"extra": np.zeros(2)}, "unknown arrays extra"),
        ({"reward": np.zeros(5)}, "reward has 5 rows, obs has 2"),
        ({"reward": np.array([0.0, np.nan])}, "reward holds NaN"),
        ({"next_obs": np.zeros((2, 3))}, "next_obs has shape"),
        ({"format_version": 7}, "format_version 7"),
    ],
)
def test_a_bad_demo_file_is_named(tmp_path, arrays, message):
    good = {
        "format_version": 1, "obs": np.zeros((2, 2)), "action": np.zeros((2, 1)),
        "reward": np.zeros(2), "next_obs": np.zeros((2, 2)), "terminal": np.zeros(2, bool),
    }  # fmt: skip
    if "missing" in message:
        good = {"format_version": 1}
    np.savez(tmp_path / "bad.npz", **{**good, **arrays})
    with pytest.raises(DemoFileError, match=message):
        load_demos(tmp_path / "bad.npz")
    (tmp_path / "junk.npz").write_text("not a zip")
    with pytest.raises(DemoFileError, match="not a readable"):
        load_demos(tmp_path / "junk.npz")
