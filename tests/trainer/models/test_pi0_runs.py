"""A π0 trained by runs, on a tiny π0 written through the user's path: its chunk's
log-probs recomputed from the stored chain, batch-invariant, carried through the plan
cache and the rollout storage into the update; SFT with its flow-matching loss, then
GRPO and PPO from the SFT checkpoint; the normalisation statistics travelling with the
weights; the example from the CLI, evaluation and the model card."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from trainer.config.errors import ConfigError
from trainer.config.loading import load_config
from trainer.envs.builtin_reach import BuiltinReachEnv
from trainer.models.card import model_card
from trainer.models.vla import Pi0ChunkPolicy, write_tiny_once
from trainer.runner.build import build_critic, build_policy
from trainer.runner.checkpoints import latest_checkpoint, load_checkpoint
from trainer.runner.on_policy_runner import OnPolicyRunner

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples/builtin_pi0.yaml"
IMAGE = 32
NOT_GRPO = ("algorithm.loss_aggregation=rows", "algorithm.reward_filter.enabled=false")

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("pi0") / "tiny"
    write_tiny_once(folder, BuiltinReachEnv(1, vision_language=True, image_size=IMAGE)
                    .vision_language, "pi0")  # fmt: skip
    return folder


def pi0_config(tiny: Path, tmp_path: Path, *overrides: str):
    return load_config(
        EXAMPLE,
        [f"actor.model.path={tiny}", "actor.model.build_tiny=false", f"env.image_size={IMAGE}",
         "actor.model.init_from=null", f"runner.output_dir={tmp_path}", "runner.progress=false",
         "env.num_parallel_envs=4", "algorithm.group_size=4", "algorithm.data_batch_size=16",
         "runner.torch_threads=1", *overrides],
    )  # fmt: skip


def policy_and_obs(config, copies: int = 6, task: int = 0):
    env = BuiltinReachEnv(copies, vision_language=True, image_size=IMAGE)
    obs = env.reset(task, env.init_states(task)[:copies])
    policy = build_policy(config, env.obs_shape, env.action_dim, env.vision_language)
    return policy, obs


@pytest.mark.parametrize("stochastic", ["all", "one"])
def test_a_chunks_log_prob_is_recomputed_from_its_plans_chain_for_every_offset(
    tiny, tmp_path, stochastic
):
    config = pi0_config(tiny, tmp_path, f"actor.model.flow.stochastic_steps={stochastic}")
    policy, obs = policy_and_obs(config)
    assert isinstance(policy, Pi0ChunkPolicy) and policy.plan_latent_size == 5 * 50 * 32 + 4
    horizons = torch.tensor([5, 10] * 3)
    torch.manual_seed(0)
    plan, per_chunk, latent = policy.sample_plan_with_latent(obs, horizons, steps=10, chunk=5)
    assert plan.shape == (6, 10, 7) and per_chunk.shape == (6, 2) and latent.shape == (6, 8004)
    for offset in (0, 5):
        offsets = torch.full((6,), offset)
        tokens, entropy = policy.token_log_probs(
            obs, horizons, offsets, plan[:, offset : offset + 5], latent
        )
        assert tokens.shape == entropy.shape == (6, 5, 7)
        torch.testing.assert_close(tokens.sum((1, 2)), per_chunk[:, offset // 5],
                                   atol=1e-4, rtol=1e-5)  # fmt: skip
        # The injected noise's entropy: fixed by the noise level and the steps that
        # injected it, the same for every token of a row (of every row when all do).
        assert torch.all(entropy == entropy[:, :1, :1])
        assert torch.all(entropy == entropy[0, 0, 0]) == (stochastic == "all")
    with pytest.raises(ValueError, match="chain"):
        policy.token_log_probs(obs, horizons, torch.zeros(6, dtype=torch.long), plan[:, :5])

    # A token per denoising step: the same densities, split by the step that made them.
    policy.step_tokens = True
    offsets = torch.full((6,), 5)
    per_step, noise = policy.token_log_probs(obs, horizons, offsets, plan[:, 5:], latent)
    assert per_step.shape == noise.shape == (6, 4 * 5, 7)
    torch.testing.assert_close(per_step.sum((1, 2)), per_chunk[:, 1], atol=1e-4, rtol=1e-5)
    silent = (per_step.view(6, 4, 5, 7) == 0).all(-1).all(-1)  # the ODE's steps
    assert silent.sum().item() == (0 if stochastic == "all" else 6 * 3)
    policy.step_tokens = False

    # Alone or beside other rows, a row's chain scores the same.
    alone, _ = policy.token_log_probs(
        obs[:1], horizons[:1], torch.zeros(1, dtype=torch.long), plan[:1, :5], latent[:1]
    )
    beside, _ = policy.token_log_probs(
        obs[[3, 0, 5]], horizons[[3, 0, 5]], torch.zeros(3, dtype=torch.long),
        plan[[3, 0, 5], :5], latent[[3, 0, 5]],
    )  # fmt: skip
    torch.testing.assert_close(alone[0], beside[1], atol=1e-5, rtol=1e-5)


def test_a_deterministic_plan_is_the_librarys_own_sampling_unnormalised(tiny, tmp_path):
    policy, obs = policy_and_obs(pi0_config(tiny, tmp_path))
    torch.manual_seed(3)
    plan, _ = policy.sample_plan(obs, torch.full((6,), 10), deterministic=True, steps=10)
    torch.manual_seed(3)
    noise = torch.randn(6, 50, 32)
    chunk = policy.backbone.sample_actions(**policy.inputs(obs), noise=noise, num_steps=4)
    torch.testing.assert_close(plan, policy.normaliser.actions(chunk[:, :10]), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "flow", [[], ["actor.model.flow.stochastic_steps=one"], ["actor.model.flow.step_tokens=true"]]
)
def test_the_update_recomputes_the_rollouts_log_probs_through_the_storage(tiny, tmp_path, flow):
    """One epoch of one minibatch: the ratio of the first (only) step is 1 wherever the
    chain the rollout stored comes back to the update: with every denoising step
    stochastic, with one drawn per decision, and with a token per step."""
    config = pi0_config(tiny, tmp_path, "algorithm.update_epochs=1",
                        "algorithm.num_minibatches=1", "runner.iterations=1", *flow)  # fmt: skip
    runner = OnPolicyRunner(config)
    before = {n: p.detach().clone() for n, p in runner.algorithm.policy.named_parameters()}
    [row] = runner.learn()
    assert row["losses/approx_kl_chunk"] < 1e-8 and row["losses/approx_kl_token"] < 1e-8
    assert np.isfinite(row["losses/policy_loss"]) and row["losses/updates"] == 1
    # A token per denoising step: each step's KL and clip fraction apart.
    per_step = sorted(key for key in row if key.startswith("losses/") and "_step" in key)
    if flow == ["actor.model.flow.step_tokens=true"]:
        assert per_step == sorted(f"losses/{name}_step{k}" for k in range(4)
                                  for name in ("approx_kl", "clip_fraction"))  # fmt: skip
        assert all(row[key] < 1e-8 for key in per_step)
    else:
        assert per_step == []
    after = dict(runner.algorithm.policy.named_parameters())
    changed = [n for n, p in after.items() if not torch.equal(p.detach(), before[n])]
    assert any(".dit." in n for n in changed) and any(".vlm." in n for n in changed)


def test_sft_fits_the_demos_statistics_and_grpo_and_ppo_start_from_its_checkpoint(tiny, tmp_path):
    demos = tmp_path / "demos.npz"
    sft = pi0_config(
        tiny, tmp_path / "sft", "algorithm.name=bc", *NOT_GRPO, f"algorithm.bc.demos={demos}",
        "algorithm.bc.scripted_episodes=8", "algorithm.bc.updates_per_iteration=25",
        "actor.learning_rate=0.001", "algorithm.group_size=1", "algorithm.data_batch_size=4",
        "runner.iterations=6", "runner.checkpoint_every=6",
    )  # fmt: skip
    runner = OnPolicyRunner(sft)
    normaliser = runner.algorithm.policy.normaliser
    # The tiny model's processor has no statistics for this robot: the demos give them.
    assert normaliser.source == "demos" and len(normaliser.action_mean) == 7
    history = runner.learn()
    losses = [row["bc/loss"] for row in history]
    assert losses[-1] < losses[0] * 0.8 and "bc/nll_per_action_dim" not in history[0]
    state = load_checkpoint(latest_checkpoint(tmp_path / "sft/checkpoints"))["algorithm"]
    assert state["policy"]["_extra_state"]["normaliser"] == normaliser.to_json()
    sft_weights = runner.algorithm.policy.state_dict()
    grpo = OnPolicyRunner(
        pi0_config(tiny, tmp_path / "grpo", f"actor.model.init_from={tmp_path / 'sft'}")
    )
    assert grpo.algorithm.policy.normaliser == normaliser
    for name, tensor in grpo.algorithm.policy.state_dict().items():
        if name != "_extra_state":
            assert torch.equal(tensor, sft_weights[name]), name

    ppo = OnPolicyRunner(pi0_config(
        tiny, tmp_path / "ppo", f"actor.model.init_from={tmp_path / 'sft'}", "algorithm.name=ppo",
        "algorithm.group_size=1", *NOT_GRPO, "runner.iterations=1", "critic.hidden_sizes=[16]",
        "runner.checkpoint_every=1",
    ))  # fmt: skip
    critic = ppo.algorithm.critic
    assert type(critic).__name__ == "Pi0ValueHead"
    # The critic reads the policy's prefix: its own parameters are the head and the plan's.
    assert set(critic.state_dict()) == {"head.0.weight", "head.0.bias", "head.2.weight",
                                        "head.2.bias", "horizon_embedding.weight",
                                        "offset_embedding.weight"}  # fmt: skip
    [row] = ppo.learn()
    assert np.isfinite(row["losses/value_loss"]) and np.isfinite(row["losses/policy_loss"])
    saved = load_checkpoint(latest_checkpoint(tmp_path / "ppo/checkpoints"))["algorithm"]
    assert set(saved["critic"]) == set(critic.state_dict())


def test_ppos_critic_reads_the_prefix_the_log_prob_pass_ran(tiny, tmp_path):
    """The update's value loss takes the prefix features of the log-prob pass just run for
    every row whose observation is its plan's; the other rows' prefix runs for them
    alone. Values and gradients are those of a critic running its own prefix."""
    config = pi0_config(tiny, tmp_path, "algorithm.name=ppo", "algorithm.group_size=1",
                        *NOT_GRPO, "critic.hidden_sizes=[16]")  # fmt: skip
    policy, obs = policy_and_obs(config)
    critic = build_critic(config, policy, obs.shape[1:])
    assert policy.shares_prefix
    horizons = torch.tensor([5, 10] * 3)
    torch.manual_seed(0)
    plan, _, latent = policy.sample_plan_with_latent(obs, horizons, steps=10, chunk=5)
    offsets = torch.tensor([0, 5, 0, 0, 0, 5])
    later = BuiltinReachEnv(6, vision_language=True, image_size=IMAGE)
    later.reset(0, later.init_states(0)[:6])
    step_obs = torch.where((offsets > 0).view(-1, 1), later.step(plan[:, :5]).obs, obs)
    chunk = torch.stack([plan[row, o : o + 5] for row, o in enumerate(offsets.tolist())])
    prefixes: list[int] = []  # the rows of each prefix forward
    policy.backbone.model.vlm.register_forward_pre_hook(
        lambda module, args, kwargs: prefixes.append(kwargs["inputs_embeds"].shape[0]),
        with_kwargs=True,
    )

    def losses(share: bool):
        policy.zero_grad()
        critic.zero_grad()
        prefixes.clear()
        tokens, _ = policy.token_log_probs(obs, horizons, offsets, chunk, latent)
        if not share:
            policy._shared.rows = None
        values = critic(step_obs, horizons, offsets)
        (tokens.sum() + values.square().sum()).backward()
        grads = {name: p.grad.clone() for name, p in policy.named_parameters()
                 if p.grad is not None}  # fmt: skip
        return values.detach(), grads, list(prefixes)

    shared_values, shared_grads, shared_prefixes = losses(share=True)
    own_values, own_grads, own_prefixes = losses(share=False)
    assert shared_prefixes == [6, 2] and own_prefixes == [6, 6]  # two rows past a decision
    torch.testing.assert_close(shared_values, own_values, atol=1e-5, rtol=1e-5)
    assert shared_grads.keys() == own_grads.keys() and shared_grads
    for name, grad in shared_grads.items():
        torch.testing.assert_close(grad, own_grads[name], atol=1e-5, rtol=1e-4, msg=name)
    # After a pass in another grad mode, every row runs its own prefix.
    with torch.no_grad():
        policy.token_log_probs(obs, horizons, offsets, chunk, latent)
    prefixes.clear()
    critic(obs, horizons, offsets)
    assert prefixes == [6]


def test_a_critic_off_the_backbone_reads_the_shared_features_under_a_stop_gradient(tiny, tmp_path):
    """`critic.train_backbone: false`: the value loss trains the head alone (no gradient
    reaches the backbone); the values are those of the same critic on the backbone, the
    log-prob pass's features still serve the rows at a decision (of either grad mode),
    and the other rows' prefix runs without a graph."""
    config = pi0_config(tiny, tmp_path, "algorithm.name=ppo", "algorithm.group_size=1",
                        *NOT_GRPO, "critic.hidden_sizes=[16]")  # fmt: skip
    policy, obs = policy_and_obs(config)
    critic = build_critic(config, policy, obs.shape[1:])
    critic_off = config.critic.model_copy(update={"train_backbone": False})
    detached = build_critic(config.model_copy(update={"critic": critic_off}), policy, obs.shape[1:])
    detached.load_state_dict(critic.state_dict())
    horizons, offsets = torch.tensor([5, 10] * 3), torch.tensor([0, 5, 0, 0, 0, 5])
    torch.manual_seed(0)
    plan, _, latent = policy.sample_plan_with_latent(obs, horizons, steps=10, chunk=5)
    chunk = torch.stack([plan[row, o : o + 5] for row, o in enumerate(offsets.tolist())])
    later = BuiltinReachEnv(6, vision_language=True, image_size=IMAGE)
    later.reset(0, later.init_states(0)[:6])
    step_obs = torch.where((offsets > 0).view(-1, 1), later.step(plan[:, :5]).obs, obs)
    graphs: list[bool] = []  # whether each prefix forward built a graph
    policy.backbone.model.vlm.register_forward_pre_hook(
        lambda module, args, kwargs: graphs.append(torch.is_grad_enabled()), with_kwargs=True
    )
    policy.token_log_probs(obs, horizons, offsets, chunk, latent)
    values = detached(step_obs, horizons, offsets)
    assert graphs == [True, False]  # the pass's own, then the two other rows' alone
    policy.zero_grad()
    values.square().sum().backward()
    assert all(p.grad is None for p in policy.parameters())
    assert all(p.grad is not None for p in detached.head.parameters())
    expected = critic(step_obs, horizons, offsets)
    torch.testing.assert_close(values, expected, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        policy.token_log_probs(obs, horizons, offsets, chunk, latent)
    graphs.clear()
    detached(obs, horizons, offsets)
    assert graphs == []  # every row at its decision: the no-grad pass's features serve


def test_only_a_pi0s_critic_reads_the_backbone_under_a_stop_gradient(tmp_path):
    with pytest.raises(
        ConfigError, match="critic.train_backbone: false needs a π0's value head; a mlp"
    ):
        load_config(ROOT / "examples/builtin_ppo.yaml", ["critic.train_backbone=false"])
    # A vla's family is its folder's, known once built: build_critic refuses the others.
    config = load_config(ROOT / "examples/builtin_ppo.yaml")
    refused = config.critic.model_copy(update={"train_backbone": False})
    config = config.model_copy(update={"critic": refused})
    with pytest.raises(ConfigError, match="critic.train_backbone: false needs a π0"):
        build_critic(config, build_policy(config, (10,), 7), (10,))


def test_a_horizon_past_the_chunk_is_a_config_error(tiny, tmp_path):
    with pytest.raises(ConfigError, match="actor.model.path: .*longest horizon \\(60\\) exceeds"):
        OnPolicyRunner(pi0_config(tiny, tmp_path, "rollout.action_horizons_pattern=[60]"))


def test_the_example_runs_from_the_cli_evaluates_and_describes_its_model(tiny, tmp_path):
    """`python -m trainer run examples/builtin_pi0.yaml`: its SFT start trained first, RL
    from it; then `python -m trainer eval` on the run, and the card the run page shows."""
    sft = tmp_path / "sft.yaml"
    text = (ROOT / "examples/builtin_pi0_sft.yaml").read_text()
    for old, new in [
        ("var/models/tiny-pi0-builtin-64", str(tiny)),
        ("var/demos/builtin-pi0-reach-red.npz", str(tmp_path / "demos.npz")),
        ("var/runs/builtin-pi0-sft", str(tmp_path / "sft")),
        ("iterations: 20", "iterations: 1"), ("scripted_episodes: 64", "scripted_episodes: 4"),
        ("num_parallel_envs: 16", "num_parallel_envs: 4"),
        ("image_size: 64", f"image_size: {IMAGE}"), ("torch_threads: 2", "torch_threads: 1"),
    ]:  # fmt: skip
        assert old in text, old
        text = text.replace(old, new)
    sft.write_text(text)
    run = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "trainer", "run", str(EXAMPLE), "runner.iterations=1",
         f"runner.output_dir={run}", f"actor.model.path={tiny}", "actor.model.build_tiny=false",
         f"actor.model.init_from={sft}", f"env.image_size={IMAGE}", "runner.progress=false",
         "env.num_parallel_envs=2", "algorithm.group_size=2", "algorithm.data_batch_size=4",
         "runner.torch_threads=1", "runner.checkpoint_every=1"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "training the run it starts from first" in result.stdout
    assert (run / "metrics.jsonl").read_text().count("\n") == 1
    result = subprocess.run(
        [sys.executable, "-m", "trainer", "eval", str(run), "--states", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    table = json.loads(next(run.glob("eval-builtin_reach-iter1.json")).read_text())
    assert table["iteration"] == 1 and len(table["tasks"]) == 1

    config = pi0_config(tiny, tmp_path / "card")
    policy, _ = policy_and_obs(config)
    card = model_card(policy, config.actor.model)
    assert card["family"] == "pi0" and card["chunk_size"] == 50 and card["denoising_steps"] == 4
    assert card["noise"] == "sde (Flow-SDE), level 0.5" and card["normalisation"] == "identity"
    assert 0 < card["expert_parameters"] < card["parameters"] and card["image_size"] == [32, 32]


def test_lora_on_a_pi0_trains_adapters_only_and_a_frozen_tower_stays_out_of_checkpoints(
    tiny, tmp_path
):
    config = pi0_config(
        tiny, tmp_path, "actor.model.lora.rank=4", "actor.model.freeze_vision=true",
        "runner.iterations=1", "runner.checkpoint_every=1",
    )  # fmt: skip
    runner = OnPolicyRunner(config)
    policy = runner.algorithm.policy
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)
    assert any(".dit." in name for name in trainable)  # the expert's projections too
    assert not any("vision_tower" in name for name in trainable)
    runner.learn()
    saved = set(load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))["algorithm"]["policy"])
    assert trainable <= saved and "_extra_state" in saved
    assert not any("vision_tower" in name or name.endswith("base_layer.weight") for name in saved)


def test_gradient_checkpointing_recomputes_the_vision_tower_and_keeps_the_kv_cache(tiny, tmp_path):
    """The prefix's KV cache feeds every denoising step, so a π0 checkpoints its vision
    tower only; log-probs stay exact and gradients reach the prefix."""
    config = pi0_config(tiny, tmp_path, "actor.model.gradient_checkpointing=true")
    policy, obs = policy_and_obs(config, copies=3)
    tower = policy.backbone.model.vlm.vision_tower
    assert tower.is_gradient_checkpointing
    assert not policy.backbone.model.vlm.language_model.gradient_checkpointing
    horizons = torch.full((3,), 5)
    plan, per_chunk, latent = policy.sample_plan_with_latent(obs, horizons, chunk=5)
    tokens, _ = policy.token_log_probs(obs, horizons, torch.zeros(3, dtype=torch.long),
                                       plan[:, :5], latent)  # fmt: skip
    torch.testing.assert_close(tokens.sum((1, 2)), per_chunk[:, 0], atol=1e-4, rtol=1e-5)
    tokens.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in tower.parameters())
