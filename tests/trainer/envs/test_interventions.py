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


class CountingOperator(ScriptedReachOperator):
    """The scripted operator, counting how often it is asked."""

    asked = 0

    def act(self, obs, episode_step):
        self.asked += 1
        return super().act(obs, episode_step)


def test_a_chunk_is_stepped_one_action_at_a_time_with_the_operator_asked_before_each():
    env = BuiltinReachEnv(4, seed=0, max_episode_steps=6)
    operator = CountingOperator(4, share=1.0, max_steps=2)
    wrapped = InterventionEnv(env, operator)
    wrapped.reset(0, env.init_states(0)[:4])
    policy = torch.full((4, 4, 7), 0.25)
    step = wrapped.step(policy)
    assert operator.asked == 4 and step.executed_actions.tolist() == [4] * 4
    # The operator drives the first two env steps of each episode, the policy the rest.
    assert step.human_actions.tolist() == [[True, True, False, False]] * 4
    assert step.intervened.all() and not step.held.any()
    torch.testing.assert_close(step.applied_actions[:, 2:], policy[:, 2:])
    assert not torch.allclose(step.applied_actions[:, :2], policy[:, :2])
    # 6-step episodes: the next chunk ends them after two of its actions.
    step = wrapped.step(policy)
    assert step.executed_actions.tolist() == [2] * 4 and step.truncated.all()
    assert step.applied_actions.shape == (4, 2, 7)  # nothing ran after every copy ended
    assert not step.intervened.any()  # past the operator's two steps
    # The copies start their next episode: the operator takes over again.
    step = wrapped.step(policy)
    assert step.human_actions[:, :2].all() and step.intervened.all()


def _first_episodes(chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each copy's first episode, steered by the operator, stepped `chunk` actions at a
    time: its return, length in env actions and success."""
    env = BuiltinReachEnv(8, seed=3, max_episode_steps=40)
    wrapped = InterventionEnv(env, ScriptedReachOperator(8, share=1.0, speed=0.3))
    wrapped.reset(0, env.init_states(0)[:8])
    returns, lengths = torch.zeros(8), torch.zeros(8, dtype=torch.long)
    success, running = torch.zeros(8, dtype=torch.bool), torch.ones(8, dtype=torch.bool)
    while running.any():
        step = wrapped.step(torch.zeros(8, chunk, 7))
        returns += torch.where(running, step.reward, 0.0)
        lengths += torch.where(running, step.executed_actions, 0)
        success |= running & step.success
        running &= ~step.done
    return returns, lengths, success


def test_a_chunk_counts_each_copy_up_to_its_own_episodes_end():
    """Episodes that end inside a chunk: the chunk's return and executed actions stop
    where each copy's episode did, as when stepping one action at a time."""
    one_by_one, chunked = _first_episodes(1), _first_episodes(5)
    lengths = one_by_one[1]
    assert bool(one_by_one[2].all()) and bool((lengths % 5 != 0).any())  # ends mid-chunk
    for single, chunk in zip(one_by_one, chunked, strict=True):
        torch.testing.assert_close(chunk, single)
