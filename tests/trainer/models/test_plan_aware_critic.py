"""The critics know the plan: ``V(obs, H, offset)``. One observation mid-plan or at
another horizon is another state (the next replan is nearer or further), so values that
ignored the plan averaged those states together. A critic saved before the plan inputs
loads with them at zero: the values it had, whatever the plan, until it learns them."""

from pathlib import Path

import pytest
import torch

from trainer.algorithms import PPO, OnPolicySettings
from trainer.commands.tiny_vla import instructions
from trainer.config.loading import load_config
from trainer.envs import BuiltinReachEnv
from trainer.models import GaussianChunkPolicy, ValueCritic, assign_horizons, build_encoder
from trainer.models.vla.tiny import build_tiny_vla
from trainer.models.vla.value_head import VLAValueHead
from trainer.runner.build import build_policy

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[3]
IMAGE = 32
# (H, offset) of two plan positions of one observation, and the values to learn there.
POSITIONS = (torch.tensor([5, 10]), torch.tensor([0, 5]))
TARGETS = torch.tensor([0.0, 1.0])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("models") / "tiny-vla"
    return build_tiny_vla(folder, instructions("builtin_reach", IMAGE), image_size=IMAGE)


def _vla_critic(tiny: Path, tmp_path: Path) -> tuple[VLAValueHead, torch.Tensor]:
    config = load_config(
        ROOT / "examples/builtin_vla.yaml",
        [f"actor.model.path={tiny}", "actor.model.build_tiny=false", f"env.image_size={IMAGE}",
         "actor.model.init_from=null", f"runner.output_dir={tmp_path}"],
    )  # fmt: skip
    env = BuiltinReachEnv(1, vision_language=True, image_size=IMAGE)
    obs = env.reset(2, env.init_states(2)[:1])
    policy = build_policy(config, env.obs_shape, env.action_dim, env.vision_language)
    return VLAValueHead(policy, (16,)), obs


def _mlp_critic() -> tuple[ValueCritic, torch.Tensor]:
    torch.manual_seed(0)
    critic = ValueCritic(build_encoder("mlp", (19,), (16,)), (16,), max_horizon=15)
    return critic, torch.randn(1, 19)


def _regress(critic: torch.nn.Module, obs: torch.Tensor, steps: int) -> torch.Tensor:
    """A few Adam steps of the critic's own parameters toward TARGETS at POSITIONS."""
    twice = obs.expand(2, *obs.shape[1:])
    optimizer = torch.optim.Adam(critic.parameters(), lr=0.01)
    for _ in range(steps):
        loss = ((critic(twice, *POSITIONS).float() - TARGETS) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        return critic(twice, *POSITIONS).float()


def test_the_mlp_critic_values_one_observation_apart_at_two_plan_positions():
    critic, obs = _mlp_critic()
    values = _regress(critic, obs, steps=150)
    assert values.tolist() == pytest.approx(TARGETS.tolist(), abs=0.05)


def test_the_vla_value_head_values_one_observation_apart_at_two_plan_positions(tiny, tmp_path):
    critic, obs = _vla_critic(tiny, tmp_path)
    values = _regress(critic, obs, steps=60)
    assert values.tolist() == pytest.approx(TARGETS.tolist(), abs=0.1)


def _old_format(state: dict, plan_keys: set[str]) -> dict:
    """A critic's state as saved before the plan inputs: the same without them."""
    assert plan_keys <= set(state)
    return {name: value for name, value in state.items() if name not in plan_keys}


@pytest.mark.parametrize("kind", ["mlp", "vla"])
def test_a_critic_saved_before_the_plan_inputs_loads_them_at_zero(kind, tiny, tmp_path):
    if kind == "mlp":
        saved, obs = _mlp_critic()
        fresh = ValueCritic(build_encoder("mlp", (19,), (16,)), (16,), max_horizon=15)
        plan_keys = {"plan_input.weight"}
    else:
        saved, obs = _vla_critic(tiny, tmp_path)
        fresh = VLAValueHead(saved.policy, (16,))
        plan_keys = {"horizon_embedding.weight", "offset_embedding.weight"}
    fresh.load_state_dict(_old_format(saved.state_dict(), plan_keys))
    state = fresh.state_dict()
    assert all(bool((state[name] == 0).all()) for name in plan_keys)
    # Every plan position gets one value, as the critic that did not see the plan gave.
    twice = obs.expand(2, *obs.shape[1:])
    with torch.no_grad():
        values = fresh(twice, *POSITIONS)
    assert values[0].item() == pytest.approx(values[1].item(), abs=1e-6)
    # A state of today's format loads as it was saved.
    fresh.load_state_dict(saved.state_dict())
    for name, value in saved.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], value)
    # Half of the plan inputs is not an old format: that is refused as any bad state is.
    partial = dict(saved.state_dict())
    partial.pop(sorted(plan_keys)[0])
    if len(plan_keys) > 1:
        with pytest.raises(RuntimeError, match="Missing key"):
            fresh.load_state_dict(partial)


def _ppo(env: BuiltinReachEnv) -> PPO:
    policy = GaussianChunkPolicy(build_encoder("mlp", env.obs_shape, (16,)), 7, 7, 10)
    critic = ValueCritic(build_encoder("mlp", env.obs_shape, (16,)), max_horizon=10)
    return PPO(policy, critic, OnPolicySettings(update_epochs=1, num_minibatches=1), chunk=5)


def _round(env: BuiltinReachEnv, algorithm: PPO):
    algorithm.start_round(assign_horizons([5, 10], env.num_envs), num_steps=2)
    obs = env.reset(0, env.init_states(0)[: env.num_envs])
    for _ in range(2):
        step = env.step(algorithm.act(obs))
        algorithm.process_env_step(step)
        obs = step.obs
    batch = algorithm.finish_round(0, torch.arange(env.num_envs), torch.arange(env.num_envs))
    return algorithm.compute_returns(batch)


def test_a_ppo_checkpoint_saved_before_the_plan_inputs_resumes_and_trains():
    torch.manual_seed(0)
    env = BuiltinReachEnv(num_envs=4, max_episode_steps=10)
    trained = _ppo(env)
    trained.update(_round(env, trained))
    state = trained.state_dict()
    # Before the plan inputs the critic lacked its last parameter, the optimizer's last;
    # and one optimizer group held the policy's parameters, then the critic's.
    state["critic"] = _old_format(state["critic"], {"plan_input.weight"})
    optimizer = state["optimizer"]
    policy_group, critic_group = optimizer["param_groups"]
    last = critic_group["params"][-1]
    both = policy_group["params"] + critic_group["params"][:-1]
    optimizer["param_groups"] = [{**policy_group, "params": both}]
    optimizer["state"] = {k: v for k, v in optimizer["state"].items() if k != last}
    resumed = _ppo(env)
    resumed.load_state_dict(state)
    assert bool((resumed.critic.plan_input.weight == 0).all())
    assert len(resumed.optimizer.param_groups) == 2
    for name in ("policy", "critic"):
        moments = resumed.optimizer.state[next(getattr(resumed, name).parameters())]
        saved = trained.optimizer.state[next(getattr(trained, name).parameters())]
        assert torch.equal(moments["exp_avg"], saved["exp_avg"])
    metrics = resumed.update(_round(env, resumed))
    assert torch.isfinite(torch.tensor(metrics["losses/value_loss"]))
    assert bool((resumed.critic.plan_input.weight != 0).any())  # it learns the plan now
