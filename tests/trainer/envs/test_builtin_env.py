import pytest
import torch

from trainer.config.errors import ConfigError
from trainer.config.loading import load_config
from trainer.envs import TASK_NAMES, BuiltinReachEnv, make_vector_env
from trainer.runner.build import env_options

torch.set_num_threads(1)


def _towards(env: BuiltinReachEnv, obs: torch.Tensor, task_id: int, close: bool) -> torch.Tensor:
    """A scripted expert: full speed towards the task's marker, gripper as required."""
    direction = obs[:, 4:7]  # the goal marker relative to the effector
    action = torch.zeros(env.num_envs, 7)
    action[:, :3] = (direction / env.step_size).clamp(-1, 1)
    action[:, 6] = 1.0 if close else -1.0
    return action


def test_it_has_several_tasks_a_7d_action_space_and_fixed_init_states():
    env = BuiltinReachEnv(num_envs=4, init_states_per_task=50, seed=3)
    assert env.num_tasks == len(TASK_NAMES) >= 4
    assert env.action_dim == 7
    again = BuiltinReachEnv(num_envs=2, init_states_per_task=50, seed=3)
    for task_id in range(env.num_tasks):
        states = env.init_states(task_id)
        assert states.shape == (50, 12)
        assert torch.equal(states, again.init_states(task_id))
    assert not torch.equal(env.init_states(0), env.init_states(1))


def test_it_resets_each_copy_to_the_init_state_it_is_given():
    env = BuiltinReachEnv(num_envs=3)
    states = env.init_states(2)[[7, 0, 7]]
    obs = env.reset(2, states)
    assert obs.shape == (3, *env.obs_shape)
    assert torch.equal(obs[:, :3], states[:, :3])
    markers = states[:, 3:].reshape(3, 3, 3)
    assert torch.allclose(obs[:, 4:7], markers[:, 2] - states[:, :3])  # goal of task 2 first
    assert torch.allclose(obs[:, 7:10], markers[:, 0] - states[:, :3])
    assert torch.allclose(obs[:, 10:13], markers[:, 1] - states[:, :3])
    assert torch.equal(obs[:, 13:], torch.eye(6)[[2, 2, 2]])
    assert torch.equal(obs[0], obs[2])


@pytest.mark.parametrize("task_id", range(6))
def test_an_expert_succeeds_with_a_sparse_reward_and_the_true_final_observation(task_id):
    env = BuiltinReachEnv(num_envs=8)
    obs = env.reset(task_id, env.init_states(task_id)[:8])
    start = obs.clone()
    close = TASK_NAMES[task_id].startswith("grasp")
    ended = torch.zeros(8, dtype=torch.bool)
    for _ in range(env.max_episode_steps):
        step = env.step(_towards(env, obs, task_id, close))
        first = step.done & ~ended
        assert torch.equal(step.reward[~step.done], torch.zeros(int((~step.done).sum())))
        assert step.terminated[first].all() and not step.truncated[first].any()
        assert torch.equal(step.reward[first], torch.ones(int(first.sum())))
        final = step.final_observation[first]
        assert (final[:, 4:7].norm(dim=1) < env.success_radius).all()
        assert final[:, 3].eq(float(close)).all()
        # auto-reset happened: obs is the start of the next episode, same init state
        assert torch.equal(step.obs[first], start[first])
        ended |= step.done
        obs = step.obs
        if ended.all():
            break
    assert ended.all()


def test_the_wrong_gripper_state_never_succeeds():
    env = BuiltinReachEnv(num_envs=4, max_episode_steps=30)
    obs = env.reset(0, env.init_states(0)[:4])
    for _ in range(30):
        step = env.step(_towards(env, obs, 0, close=True))
        assert not step.success.any()
        obs = step.obs
    assert step.truncated.all()


def test_the_time_limit_truncates_and_reports_the_final_observation_before_reset():
    env = BuiltinReachEnv(num_envs=2, max_episode_steps=10)
    obs = env.reset(1, env.init_states(1)[:2])
    push = torch.zeros(2, 5, 7)
    push[:, :, 0] = 1.0  # drift along x, away from the start
    first = env.step(push)
    assert not first.done.any() and torch.equal(first.final_observation, first.obs)
    second = env.step(push)
    assert second.truncated.all() and not second.terminated.any()
    assert torch.equal(second.reward, torch.zeros(2))
    assert torch.allclose(second.final_observation[:, 0], (obs[:, 0] + 1.0).clamp(max=1.0))
    assert torch.equal(second.obs, obs)
    assert second.info["final_observation"] is second.final_observation


def test_a_chunk_stops_executing_when_the_episode_ends():
    env = BuiltinReachEnv(num_envs=1, max_episode_steps=7)
    env.reset(0, env.init_states(0)[:1])
    first = env.step(torch.zeros(1, 5, 7))
    second = env.step(torch.zeros(1, 5, 7))
    assert first.executed_actions.tolist() == [5]
    assert second.executed_actions.tolist() == [2] and second.truncated.all()


def test_a_random_policy_fails():
    torch.manual_seed(0)
    env = BuiltinReachEnv(num_envs=300, max_episode_steps=40)
    successes = 0
    for task_id in range(env.num_tasks):
        env.reset(task_id, env.init_states(task_id)[torch.arange(300) % 50])
        ended = torch.zeros(300, dtype=torch.bool)
        for _ in range(8):
            step = env.step(torch.randn(300, 5, 7))
            successes += int((step.success & ~ended).sum())
            ended |= step.done
        assert ended.all()
    assert successes / (300 * env.num_tasks) < 0.15


def test_bad_inputs_get_clear_errors():
    env = BuiltinReachEnv(num_envs=2)
    with pytest.raises(ValueError, match="task_id 9"):
        env.reset(9, env.init_states(0)[:2])
    with pytest.raises(ValueError, match="init_states must have shape"):
        env.reset(0, env.init_states(0)[:3])
    env.reset(0, env.init_states(0)[:2])
    with pytest.raises(ValueError, match="actions must have shape"):
        env.step(torch.zeros(2, 5, 6))
    with pytest.raises(ValueError, match="unknown env 'nope'"):
        make_vector_env("nope", num_envs=1)


def test_the_registry_builds_the_builtin_env():
    env = make_vector_env("builtin_reach", num_envs=3, max_episode_steps=12)
    assert isinstance(env, BuiltinReachEnv) and env.max_episode_steps == 12


def test_substeps_catch_a_goal_passed_through_within_one_action():
    # The effector 0.5 from the goal along x, moving 0.5 + 2 x radius in one action: at
    # the action's end it is past the goal region; a substep inside the region solves it.
    state = torch.zeros(1, 12)
    state[0, 3:6] = torch.tensor([0.5, 0.0, 0.0])  # the goal marker of reach_red
    state[0, 6:] = torch.tensor([0.0, 0.9, 0.0, 0.0, -0.9, 0.0])
    action = torch.zeros(1, 7)
    action[0, 0] = 1.0
    action[0, 6] = -1.0
    results = {}
    for substeps in (1, 20):
        env = BuiltinReachEnv(num_envs=1, step_size=0.5 + 2 * 0.2, physics_substeps=substeps)
        env.reset(0, state)
        step = env.step(action)
        results[substeps] = (bool(step.success[0]), step.final_observation[0, 0].item())
    assert results[1] == (False, pytest.approx(0.9))
    solved, stopped_at = results[20]
    assert solved and abs(stopped_at - 0.5) < 0.2
    with pytest.raises(ValueError, match="physics_substeps must be at least 1"):
        BuiltinReachEnv(num_envs=1, physics_substeps=0)


def test_with_a_camera_it_observes_its_top_down_view_and_the_scripted_operator_still_steers():
    """`camera: true`: each copy's observation is `render`'s picture as [3, S, S] floats in
    [0, 1] (what pixel RLPD learns from); the scripted operator reads the state."""
    from trainer.config.schema import ExperimentConfig
    from trainer.runner.interventions import with_interventions

    env = BuiltinReachEnv(num_envs=3, camera=True, image_size=24, max_episode_steps=40)
    assert env.obs_shape == (3, 24, 24)
    obs = env.reset(0, env.init_states(0)[:3])
    assert obs.shape == (3, 3, 24, 24) and obs.dtype == torch.float32
    for copy in range(3):
        expected = env.render(copy, 24).permute(2, 0, 1).float() / 255
        torch.testing.assert_close(obs[copy], expected)
    config = ExperimentConfig.model_validate(
        {"env": {"interventions": {"source": "scripted", "share": 1.0}}}
    )
    steered = with_interventions(env, config, link=None)
    steered.reset(0, env.init_states(0)[:3])
    solved = torch.zeros(3, dtype=torch.bool)
    for _ in range(40):
        step = steered.step(torch.zeros(3, 7))
        solved |= step.success
        assert step.obs.shape == (3, 3, 24, 24)
        assert step.final_observation.shape == (3, 3, 24, 24)
    assert solved.all()


def test_a_vla_can_be_told_other_instructions_for_some_tasks():
    config = load_config("examples/builtin_vla.yaml", ["env.instructions={0: 'reach red'}"])
    env = make_vector_env("builtin_reach", 2, **env_options(config))
    told = env.vision_language.instructions
    assert told[0] == "reach red" and told[1] == "reach the green marker with the gripper open"
    with pytest.raises(
        ValueError, match=r"instructions: the built-in env has tasks 0\.\.5, not \[9\]"
    ):
        BuiltinReachEnv(num_envs=1, vision_language=True, instructions={9: "x"})
    with pytest.raises(ConfigError, match="only the built-in env's tasks can be renamed"):
        load_config("examples/libero_spatial_vla.yaml", ["env.instructions={0: 'x'}"])
