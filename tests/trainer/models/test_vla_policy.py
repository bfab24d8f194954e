"""The VLA policy on a tiny PaliGemma saved the way a user's checkpoint folder is: exact
log-probs through the chunked contract, action tokens, the processor's preprocessing as
tensor work, LoRA and a frozen vision tower, folder errors, and GRPO end to end."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from trainer.commands.tiny_vla import instructions
from trainer.config.errors import ConfigError
from trainer.config.loading import load_config
from trainer.config.schema import LoraConfig, ModelConfig
from trainer.envs.builtin_reach import INSTRUCTIONS, BuiltinReachEnv
from trainer.envs.vision_language import VisionLanguageSpec
from trainer.models.vla import ActionBins, VLAChunkPolicy, build_vla_policy, fingerprint
from trainer.models.vla.folder import load_folder
from trainer.models.vla.policy import attention_pattern
from trainer.models.vla.tiny import build_tiny_vla
from trainer.runner.build import build_policy
from trainer.runner.checkpoints import latest_checkpoint, load_checkpoint
from trainer.runner.on_policy_runner import OnPolicyRunner

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples/builtin_vla.yaml"
IMAGE = 32  # pixels: small, and still four image tokens per picture
# The example's GRPO-only settings, turned off where a test switches the algorithm.
NOT_GRPO = ("algorithm.loss_aggregation=rows", "algorithm.reward_filter.enabled=false")

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("models") / "tiny-vla"
    return build_tiny_vla(folder, instructions("builtin_reach", IMAGE), image_size=IMAGE)


# Instructions of different lengths (LIBERO's are): their prompts are left-padded to the
# longest, so a batch mixes padded and unpadded rows.
MIXED = (
    "pick up the bowl",
    "put the black bowl on the plate next to the cookie box",
    "open the top drawer",
    "turn on the stove",
)
LONGEST = 1


@pytest.fixture(scope="module")
def mixed_tiny(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("models") / "tiny-vla-mixed"
    return build_tiny_vla(folder, MIXED, image_size=IMAGE)


def mixed_policy(folder: Path, lora: LoraConfig | None = None) -> VLAChunkPolicy:
    """A VLA for two cameras and the MIXED tasks, its head (and adapters) moved off their
    fresh near-uniform start, as training leaves them: peaked logits show differences
    a fresh head would hide. In float64, so that what is compared is the computation,
    not float32's rounding of a 100-nat sum (its last bit is 8e-6)."""
    spec = VisionLanguageSpec((3, IMAGE, IMAGE), num_images=2, proprio_dim=4, instructions=MIXED)
    torch.manual_seed(0)
    policy = build_vla_policy(ModelConfig(kind="vla", path=str(folder), lora=lora), spec, 7, 10)
    with torch.no_grad():
        policy.action_head.weight.normal_(std=0.1)
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.05)
    return policy.double()


def mixed_obs(policy: VLAChunkPolicy, tasks: list[int], seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    rows = len(tasks)
    images = torch.randint(0, 256, (rows, 2, 3, IMAGE, IMAGE), generator=generator)
    proprio = torch.randn(rows, 4, generator=generator)
    return policy.spec.pack(images.to(torch.uint8), proprio, torch.tensor(tasks)).double()


def vla_config(tiny: Path, tmp_path: Path, *overrides: str):
    return load_config(
        EXAMPLE,
        [f"actor.model.path={tiny}", "actor.model.build_tiny=false", f"env.image_size={IMAGE}",
         "actor.model.init_from=null", f"runner.output_dir={tmp_path}", "runner.progress=false",
         "env.num_parallel_envs=4", "algorithm.group_size=4", "algorithm.data_batch_size=16",
         "runner.torch_threads=1", *overrides],
    )  # fmt: skip


def policy_and_obs(config, copies: int = 6, task: int = 3):
    env = BuiltinReachEnv(copies, vision_language=True, image_size=IMAGE)
    obs = env.reset(task, env.init_states(task)[:copies])
    policy = build_policy(config, env.obs_shape, env.action_dim, env.vision_language)
    return policy, obs


def test_the_env_packs_its_view_proprio_and_task_and_the_view_is_what_the_console_sees():
    env = BuiltinReachEnv(3, vision_language=True, image_size=IMAGE)
    obs = env.reset(4, env.init_states(4)[:3])
    spec = env.vision_language
    assert spec.instructions == INSTRUCTIONS and INSTRUCTIONS[4] == (
        "grasp the green marker with the gripper closed"
    )
    images, proprio, tasks = spec.unpack(obs)
    assert images.shape == (3, 1, 3, IMAGE, IMAGE) and tasks.tolist() == [4, 4, 4]
    for copy in range(3):
        frame = env.render(copy, size=IMAGE).permute(2, 0, 1).float() / 255
        assert torch.equal(images[copy, 0], frame)
        assert torch.equal(proprio[copy, :3], env._effector[copy])
    # Split over worker processes, the env still tells the policy its layout.
    from trainer.envs.registry import make_vector_env

    split = make_vector_env(
        "builtin_reach", num_envs=4, num_workers=2, vision_language=True, image_size=IMAGE
    )
    try:
        assert split.vision_language == spec and split.obs_shape == env.obs_shape
    finally:
        split.close()


def test_sampled_log_probs_equal_the_recomputed_ones_for_every_chunk_and_horizon(tiny, tmp_path):
    config = vla_config(tiny, tmp_path, "rollout.action_horizons_pattern=[5,10,15]")
    policy, obs = policy_and_obs(config)
    assert isinstance(policy, VLAChunkPolicy) and policy.max_horizon == 15
    horizons = torch.tensor([5, 10, 15, 5, 10, 15])
    torch.manual_seed(0)
    _, sampled = policy.sample_plan(obs, horizons, chunk=5)
    # A fresh head is near uniform over the 255 bins: exploration over the whole range.
    assert sampled.mean().item() == pytest.approx(5 * 7 * -np.log(255), rel=0.01)
    for steps, deterministic in ((15, False), (10, False), (15, True)):
        plan, log_probs = policy.sample_plan(obs, horizons, deterministic, steps=steps, chunk=5)
        assert plan.shape == (6, steps, 7) and log_probs.shape == (6, steps // 5)
        # Every action is a bin centre inside the bounds.
        bins = policy.bins
        assert plan.abs().max() < 1 and torch.equal(bins.actions(bins.tokens(plan)), plan)
        for start in range(0, steps, 5):
            offsets = torch.full((6,), start)
            recomputed, entropy = policy.chunk_log_prob(
                obs, horizons, offsets, plan[:, start : start + 5]
            )
            torch.testing.assert_close(recomputed, log_probs[:, start // 5], rtol=0, atol=1e-4)
            assert (entropy > 0).all() and recomputed.requires_grad
    # Tempered, sampling and recomputing agree as exactly: both are the tempered policy's.
    policy.temperature = 0.5
    plan, tempered = policy.sample_plan(obs, horizons, steps=5, chunk=5)
    recomputed, _ = policy.chunk_log_prob(obs, horizons, torch.zeros(6), plan)
    torch.testing.assert_close(recomputed, tempered[:, 0], rtol=0, atol=1e-4)
    untempered = policy.plan_logits(obs, horizons)[:, :5].log_softmax(-1)
    tokens = policy.bins.tokens(plan)
    assert (tempered[:, 0] != untempered.gather(-1, tokens.unsqueeze(-1)).sum((1, 2, 3))).all()


def test_a_model_predicting_more_dims_than_the_env_takes_counts_only_the_envs(tiny, tmp_path):
    policy, obs = policy_and_obs(vla_config(tiny, tmp_path, "actor.model.action_dim=8"))
    horizons = torch.full((6,), 5)
    plan, log_probs = policy.sample_plan(obs, horizons, chunk=5)
    assert plan.shape == (6, 10, 8)
    recomputed, _ = policy.chunk_log_prob(obs, horizons, torch.zeros(6), plan[:, :5])
    torch.testing.assert_close(recomputed, log_probs[:, 0], rtol=0, atol=1e-4)
    plan[:, :5, 7] = 0.9  # the dim the env never takes does not change the log-prob
    torch.testing.assert_close(
        policy.chunk_log_prob(obs, horizons, torch.zeros(6), plan[:, :5])[0], recomputed
    )


def test_bins_map_centres_to_their_own_tokens_and_clamp_outside_the_range():
    bins = ActionBins(5, [-1.0, 0.0], [1.0, 2.0])
    tokens = torch.tensor([[0, 4], [3, 1]])
    torch.testing.assert_close(bins.actions(tokens), torch.tensor([[-0.8, 1.8], [0.4, 0.6]]))
    assert torch.equal(bins.tokens(bins.actions(tokens)), tokens)
    assert bins.tokens(torch.tensor([[-5.0, 9.0]])).tolist() == [[0, 4]]
    assert bins.tokens(torch.tensor([[0.1], [0.9]])).tolist() == [[2], [4]]  # fewer dims
    assert "odd number of bins" in str(
        pytest.raises(ValueError, ActionBins, 256, [0.0], [1.0]).value
    )
    assert "low < high" in str(pytest.raises(ValueError, ActionBins, 9, [1.0], [1.0]).value)


def test_a_zero_action_is_a_bin_centre_and_decodes_to_exactly_zero():
    default = ModelConfig()
    assert default.num_bins == 255 and default.action_bounds == [-1.0, 1.0]
    bins = ActionBins(default.num_bins, [-1.0] * 7, [1.0] * 7)
    zero = torch.zeros(4, 7)
    assert bins.tokens(zero).eq(127).all()
    assert bins.actions(bins.tokens(zero)).abs().max().item() == 0.0
    # Every token round-trips, and every action in range decodes within half a bin.
    tokens = torch.arange(255)[:, None].expand(-1, 7)
    assert torch.equal(bins.tokens(bins.actions(tokens)), tokens)
    actions = torch.linspace(-1, 1, 10_001)[:, None].expand(-1, 7)
    error = (bins.actions(bins.tokens(actions)) - actions).abs()
    assert error.max() <= 1 / 255 + 1e-6
    assert bins.actions(torch.tensor([[0, 254]]))[0].tolist() == pytest.approx(
        [-1 + 1 / 255, 1 - 1 / 255]
    )


def test_bounds_fitted_to_demos_span_their_quantiles_and_keep_zero_exact():
    generator = torch.Generator().manual_seed(0)
    rows = 10_000
    demos = torch.zeros(rows, 4)
    demos[:, 0] = torch.rand(rows, generator=generator) * 0.8 - 0.5  # in [-0.5, 0.3]
    demos[:50, 0] = 7.0  # a few wild outliers (0.5%): past the 99th percentile
    demos[:, 1] = torch.rand(rows, generator=generator) * 0.4 + 0.2  # in [0.2, 0.6]
    demos[:, 2] = -1.0  # never varies (a gripper always open): keeps its range
    # dim 3 all zeros; dims 4, 5 (the model's, not the env's) keep theirs
    bins = ActionBins(255, [-1.0] * 6, [2.0] * 6)
    bins.fit_bounds(demos)
    low, high = bins.low.tolist(), bins.high.tolist()
    assert low[0] == pytest.approx(-0.492, abs=0.005) and high[0] == -low[0]  # symmetric
    assert low[1] == pytest.approx(0.204, abs=0.003) and high[1] == pytest.approx(0.596, abs=0.003)
    assert low[2:] == [-1.0] * 4 and high[2:] == [2.0] * 4
    assert bins.actions(bins.tokens(torch.zeros(1, 1))).item() == 0.0
    assert bins.tokens(torch.tensor([[7.0]])).item() == 254  # outliers in the end bin


@pytest.mark.parametrize("side", [48, 20])  # the processor shrinks, then enlarges
def test_images_are_resized_as_the_processor_resizes_them(mixed_tiny, side):
    """SigLIP's processor resizes bicubic (its config's `resample`: 3) from 8-bit
    pictures: what the backbone saw in pretraining."""
    policy = mixed_policy(mixed_tiny).float()
    _, processor = load_folder(mixed_tiny)
    assert processor.image_processor.resample == 3  # PIL's bicubic
    pictures = torch.randint(0, 256, (4, side, side, 3), dtype=torch.uint8)
    expected = processor.image_processor(images=list(pictures.numpy()), return_tensors="pt")[
        "pixel_values"
    ]
    floats = pictures.permute(0, 3, 1, 2).float().div(255)
    ours = policy.pixel_values(floats[:, None])
    assert ours.shape == expected.shape == (4, 3, IMAGE, IMAGE)
    # PIL resizes in fixed point: at most one 8-bit step apart, and rarely that.
    step = 1 / 255 / 0.5
    difference = (ours - expected).abs()
    assert difference.max() <= step + 1e-6 and (difference > 1e-6).float().mean() < 0.02
    bilinear = torch.nn.functional.interpolate(
        floats, size=(IMAGE, IMAGE), mode="bilinear", antialias=True
    )
    assert ((bilinear - 0.5) / 0.5 - expected).abs().max() > 20 * step


def test_lora_trains_adapters_and_heads_and_a_frozen_tower_stays_fixed(tiny, tmp_path):
    config = vla_config(
        tiny, tmp_path, "actor.model.lora.rank=4", "actor.model.lora.target_modules=[q_proj,v_proj]"
    )
    policy, obs = policy_and_obs(config)
    trainable = {name for name, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all(
        "lora_" in name or not name.startswith("backbone.") for name in trainable
    )
    assert any("lora_" in name for name in trainable)
    assert 0 < policy.trainable_parameters() < sum(p.numel() for p in policy.parameters()) / 2
    full = policy_and_obs(vla_config(tiny, tmp_path / "f", "actor.model.freeze_vision=true"))[0]
    frozen = [n for n, p in full.named_parameters() if not p.requires_grad]
    assert frozen and all("vision_tower" in name for name in frozen)
    # Gradients reach the adapters through the decoder.
    plan, _ = policy.sample_plan(obs, torch.full((6,), 5), chunk=5)
    log_prob, _ = policy.chunk_log_prob(obs, torch.full((6,), 5), torch.zeros(6), plan[:, :5])
    log_prob.sum().backward()
    lora_grads = [p.grad for n, p in policy.named_parameters() if "lora_B" in n]
    assert lora_grads and all(g is not None and g.abs().sum() > 0 for g in lora_grads)


def test_a_missing_or_incomplete_model_folder_is_a_config_error_naming_it(tiny, tmp_path):
    absent = tmp_path / "nowhere"
    with pytest.raises(ConfigError, match=f"actor.model.path.*{absent} is not a folder"):
        policy_and_obs(vla_config(absent, tmp_path))
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "config.json").write_text((tiny / "config.json").read_text())
    with pytest.raises(ConfigError) as error:
        policy_and_obs(vla_config(partial, tmp_path))
    message = str(error.value)
    assert "the weights (model.safetensors or" in message and "the tokenizer" in message
    assert "the model's config" not in message
    with pytest.raises(ConfigError, match="a vla model needs `path`"):
        load_config(EXAMPLE, ["actor.model.path=null"])
    with pytest.raises(ConfigError, match="algorithm.name: a vla has no Q-critic"):
        load_config(EXAMPLE, ["algorithm.name=rlpd", "algorithm.group_size=1"])
    with pytest.raises(ConfigError, match="actor.strategy: a vla's value head shares"):
        load_config(EXAMPLE, ["algorithm.name=ppo", "algorithm.group_size=1", *NOT_GRPO,
                              "actor.strategy=fsdp"])  # fmt: skip


def test_grpo_trains_the_vla_from_the_example_and_resumes_from_its_checkpoint(tiny, tmp_path):
    config = vla_config(tiny, tmp_path, "runner.iterations=2", "runner.checkpoint_every=2")
    runner = OnPolicyRunner(config)
    before = {n: p.detach().clone() for n, p in runner.algorithm.policy.named_parameters()}
    runner.learn()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["iteration"] for row in rows] == [1, 2]
    assert all(np.isfinite(row["losses/policy_loss"]) and row["losses/updates"] > 0 for row in rows)
    after = dict(runner.algorithm.policy.named_parameters())
    changed = [n for n, p in after.items() if not torch.equal(p.detach(), before[n])]
    assert any(n.startswith("action_head") for n in changed)
    assert any(n.startswith("backbone.") for n in changed)
    checkpoint = latest_checkpoint(tmp_path / "checkpoints")
    state = load_checkpoint(checkpoint)
    assert state["iteration"] == 2
    resumed = OnPolicyRunner(vla_config(tiny, tmp_path, "runner.iterations=3"))
    resumed.learn(resume=True)
    assert resumed.iteration == 3


def test_ppo_trains_a_value_head_on_the_policys_backbone_and_saves_it_apart(tiny, tmp_path):
    config = vla_config(
        tiny, tmp_path, "algorithm.name=ppo", "algorithm.group_size=1", *NOT_GRPO,
        "env.num_parallel_envs=8", "actor.model.lora.rank=4", "runner.iterations=2",
        "runner.checkpoint_every=2", "critic.hidden_sizes=[16]",
    )  # fmt: skip
    runner = OnPolicyRunner(config)
    policy, critic = runner.algorithm.policy, runner.algorithm.critic
    # The critic's own parameters are its query, head and plan embeddings; the backbone
    # is the policy's.
    assert set(critic.state_dict()) == {"query", "head.0.weight", "head.0.bias",
                                        "head.2.weight", "head.2.bias", "horizon_embedding.weight",
                                        "offset_embedding.weight"}  # fmt: skip
    env = BuiltinReachEnv(3, vision_language=True, image_size=IMAGE)
    obs = env.reset(0, env.init_states(0)[:3])
    critic(obs, torch.tensor([5, 10, 10]), torch.tensor([0, 0, 5])).sum().backward()
    adapters = [p for n, p in policy.named_parameters() if "lora_" in n]
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in adapters)
    assert not any(p.grad is not None for p in policy.action_head.parameters())
    policy.zero_grad(), critic.zero_grad()
    # One optimizer step moves the backbone once, whichever loss its gradient came from.
    optimised = [p for group in runner.algorithm.optimizer.param_groups for p in group["params"]]
    assert {id(p) for p in critic.parameters()} <= {id(p) for p in optimised}
    assert len({id(p) for p in optimised}) == len(optimised)
    history = runner.learn()
    assert all(np.isfinite(row["losses/value_loss"]) for row in history)
    state = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))["algorithm"]
    assert set(state["critic"]) == set(critic.state_dict())
    frozen = {n for n, p in policy.named_parameters() if not p.requires_grad}
    assert frozen and not frozen & set(state["policy"])  # the base stays in its folder
    resumed = OnPolicyRunner(vla_config(
        tiny, tmp_path, "algorithm.name=ppo", "algorithm.group_size=1", *NOT_GRPO,
        "env.num_parallel_envs=8", "actor.model.lora.rank=4", "runner.iterations=3",
        "critic.hidden_sizes=[16]",
    ))  # fmt: skip
    resumed.learn(resume=True)
    assert resumed.iteration == 3


def test_the_example_trains_its_sft_start_first_building_the_tiny_model_on_first_use(tmp_path):
    """`python -m trainer run examples/builtin_vla.yaml` on a fresh checkout: the tiny
    model is written, the SFT run it starts from is trained (its demos recorded), then
    GRPO starts from that run's checkpoint."""
    folder, sft = tmp_path / "models/tiny", tmp_path / "sft.yaml"
    text = (ROOT / "examples/builtin_vla_sft.yaml").read_text()
    for old, new in [
        ("var/models/tiny-vla-builtin", str(folder)),
        ("var/demos/builtin-vla-reach-red.npz", str(tmp_path / "demos.npz")),
        ("var/runs/builtin-vla-sft", str(tmp_path / "sft")),
        ("iterations: 20", "iterations: 1"), ("scripted_episodes: 64", "scripted_episodes: 4"),
        ("num_parallel_envs: 16", "num_parallel_envs: 4"),
        ("image_size: 64", f"image_size: {IMAGE}"),
        ("torch_threads: 2", "torch_threads: 1"),
    ]:  # fmt: skip
        assert old in text, old
        text = text.replace(old, new)
    sft.write_text(text)
    result = subprocess.run(
        [sys.executable, "-m", "trainer", "run", str(EXAMPLE), "runner.iterations=1",
         f"runner.output_dir={tmp_path / 'run'}", f"actor.model.path={folder}",
         f"actor.model.init_from={sft}", f"env.image_size={IMAGE}", "runner.progress=false",
         "env.num_parallel_envs=2", "algorithm.group_size=2", "algorithm.data_batch_size=4",
         "runner.torch_threads=1"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "training the run it starts from first" in result.stdout
    assert (folder / "config.json").is_file() and (tmp_path / "demos.npz").is_file()
    assert latest_checkpoint(tmp_path / "sft/checkpoints") is not None
    # The run's own config names the folder it started from.
    written = load_config(tmp_path / "run/config.yaml")
    assert written.actor.model.init_from == str(tmp_path / "sft")
    assert (tmp_path / "run/metrics.jsonl").read_text().count("\n") == 1


def test_sft_imitates_scripted_demos_and_grpo_starts_from_its_checkpoint(tiny, tmp_path):
    demos = tmp_path / "demos.npz"
    sft = vla_config(
        tiny, tmp_path / "sft", "algorithm.name=bc", *NOT_GRPO, f"algorithm.bc.demos={demos}",
        "algorithm.bc.scripted_episodes=8", "algorithm.bc.updates_per_iteration=20",
        "actor.learning_rate=0.001", "actor.model.action_bounds=demos",
        "algorithm.group_size=1", "algorithm.data_batch_size=4", "runner.iterations=3",
        "runner.checkpoint_every=3",
    )  # fmt: skip
    runner = OnPolicyRunner(sft)
    # The bins span the demos' moves (the scripted operator's unit steps scaled by its
    # speed); the dims it never moves, and its gripper (always open in task 0, a
    # reach), keep the config's [-1, 1].
    bins = runner.algorithm.policy.bins
    reach = bins.high[:3]
    assert ((reach > 0.05) & (reach < 1)).all() and torch.equal(bins.low[:3], -reach)
    assert bins.low[3:].tolist() == [-1.0] * 4 and bins.high[3:].tolist() == [1.0] * 4
    history = runner.learn()
    assert demos.is_file()  # recorded by the scripted operator on first use
    losses = [row["bc/loss"] for row in history]
    assert losses[-1] < losses[0] * 0.8 and history[0]["bc/demo_rows"] > 8
    assert all("rollout/success_rate" in row for row in history)  # rollouts measure it
    sft_weights = runner.algorithm.policy.state_dict()
    grpo = OnPolicyRunner(
        vla_config(tiny, tmp_path / "grpo", f"actor.model.init_from={tmp_path / 'sft'}")
    )
    for name, tensor in grpo.algorithm.policy.state_dict().items():
        assert torch.equal(tensor, sft_weights[name]), name  # the bins' bounds too
    with pytest.raises(ConfigError, match="actor.model.action_bounds: demos: the bounds are"):
        load_config(EXAMPLE, ["actor.model.action_bounds=demos", "actor.model.init_from=null"])
    with pytest.raises(ConfigError, match="num_bins must be odd"):
        load_config(EXAMPLE, ["actor.model.num_bins=256"])
    with pytest.raises(ConfigError, match="actor.model.init_from: no checkpoint at"):
        OnPolicyRunner(vla_config(tiny, tmp_path / "x", f"actor.model.init_from={tmp_path}"))
    with pytest.raises(ConfigError, match="algorithm.bc.demos: bc imitates demonstrations"):
        load_config(EXAMPLE, ["algorithm.name=bc"])
    other = tmp_path / "state_demos.npz"
    from trainer.data.demos import record_demos, save_demos
    from trainer.envs.intervention import ScriptedReachOperator

    save_demos(other, record_demos(BuiltinReachEnv(2), ScriptedReachOperator(2), task_ids=[0]))
    with pytest.raises(ConfigError, match="holds observations of shape \\(19,\\)"):
        OnPolicyRunner(vla_config(tiny, tmp_path / "y", "algorithm.name=bc", *NOT_GRPO,
                                  f"algorithm.bc.demos={other}"))  # fmt: skip


def test_a_lora_checkpoint_keeps_what_trained_names_its_base_and_evaluates(tiny, tmp_path):
    config = vla_config(
        tiny, tmp_path, "actor.model.lora.rank=4", "actor.model.freeze_vision=true",
        "runner.iterations=1", "runner.checkpoint_every=1",
    )  # fmt: skip
    runner = OnPolicyRunner(config)
    runner.learn()
    state = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))["algorithm"]
    saved = set(state["policy"])
    trainable = {n for n, p in runner.algorithm.policy.named_parameters() if p.requires_grad}
    assert trainable <= saved and any("lora_" in name for name in saved)
    assert not any("vision_tower" in name or name.endswith("q_proj.base_layer.weight")
                   for name in saved)  # fmt: skip
    assert {"bins.low", "bins.high"} <= saved  # the tokenisation travels with the weights
    assert state["base_model"] == {"path": str(tiny), "sha256": fingerprint(tiny)}
    # The evaluation command rebuilds the policy from the base folder and the checkpoint.
    result = subprocess.run(
        [sys.executable, "-m", "trainer", "eval", str(tmp_path), "--states", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    table = json.loads(next(tmp_path.glob("eval-builtin_reach-iter1.json")).read_text())
    assert table["iteration"] == 1 and len(table["tasks"]) == 1
    # Another base (other weights in the folder) does not take this checkpoint.
    other = build_tiny_vla(tmp_path / "other", instructions("builtin_reach", IMAGE),
                           image_size=IMAGE, seed=1)  # fmt: skip
    same_setup = ["actor.model.lora.rank=4", "actor.model.freeze_vision=true"]
    with pytest.raises(ConfigError, match="was trained on .* holds other weights"):
        OnPolicyRunner(
            vla_config(other, tmp_path / "z", f"actor.model.init_from={tmp_path}", *same_setup)
        )


def test_a_rows_plan_and_log_probs_do_not_depend_on_the_rows_batched_with_it(mixed_tiny):
    """PaliGemma is the family the project supports (trainer.models.vla.tiny). Alone, a
    row of the longest instruction has no padding; beside shorter ones its prompt is the
    same, and so must be what it attends to."""
    policy = mixed_policy(mixed_tiny)
    tasks = [LONGEST, 0, 3, LONGEST, 2, 0, LONGEST, 3]
    obs = mixed_obs(policy, tasks)
    horizons = torch.tensor([5, 10] * 4)
    plan, log_probs = policy.sample_plan(obs, horizons, deterministic=True, chunk=5)
    second = torch.full((8,), 5)  # the plan's second chunk
    recomputed, _ = policy.chunk_log_prob(obs, horizons, second, plan[:, 5:])
    torch.testing.assert_close(recomputed, log_probs[:, 1], rtol=0, atol=1e-5)
    longest_only = [row for row, task in enumerate(tasks) if task == LONGEST]
    together, _ = policy.chunk_log_prob(
        obs[longest_only], horizons[longest_only], second[:3], plan[longest_only, 5:]
    )
    torch.testing.assert_close(together, recomputed[longest_only], rtol=0, atol=1e-5)
    for row in range(len(tasks)):
        one = slice(row, row + 1)
        plan_alone, log_probs_alone = policy.sample_plan(
            obs[one], horizons[one], deterministic=True, chunk=5
        )
        assert torch.equal(plan_alone, plan[one]), row
        torch.testing.assert_close(log_probs_alone, log_probs[one], rtol=0, atol=1e-5)
        alone, _ = policy.chunk_log_prob(obs[one], horizons[one], second[one], plan[one, 5:])
        torch.testing.assert_close(alone, recomputed[one], rtol=0, atol=1e-5)


def test_the_prompt_attends_both_ways_and_the_queries_read_it_never_the_reverse():
    # Row 0 is left-padded by one token; three prompt tokens, then two plan queries.
    pattern = attention_pattern(torch.tensor([[0, 1, 1], [1, 1, 1]]), queries=2)
    assert pattern.shape == (2, 1, 5, 5)
    prompt_reads, query_reads = [0, 1, 1, 0, 0], [0, 1, 1, 1, 1]
    assert pattern[0, 0].int().tolist() == [prompt_reads] * 3 + [query_reads] * 2
    prompt_reads, query_reads = [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]
    assert pattern[1, 0].int().tolist() == [prompt_reads] * 3 + [query_reads] * 2


def test_the_backbone_attends_with_sdpa_which_takes_the_policys_pattern(mixed_tiny):
    backbone, processor = load_folder(mixed_tiny)
    decoder = backbone.get_decoder()
    assert decoder.config._attn_implementation == "sdpa"
    spec = VisionLanguageSpec((3, IMAGE, IMAGE), num_images=1, proprio_dim=4, instructions=MIXED)
    decoder.config._attn_implementation = "flash_attention_2"  # would ignore a 4D mask
    with pytest.raises(ValueError, match="needs sdpa or eager attention"):
        VLAChunkPolicy(backbone, processor, spec, ActionBins(255, [-1.0] * 7, [1.0] * 7), 7, 7, 5)


def test_lora_dropout_never_splits_the_rollouts_log_probs_from_the_updates(mixed_tiny):
    lora = LoraConfig(rank=4, dropout=0.3, target_modules=["q_proj", "v_proj"])
    policy = mixed_policy(mixed_tiny, lora)
    obs = mixed_obs(policy, [0, 1, 2, 3, 1, 0])
    horizons = torch.full((6,), 5)
    for mode in ("as built", "train", "eval", "train"):
        if mode != "as built":
            getattr(policy, mode)()
        plan, sampled = policy.sample_plan(obs, horizons, chunk=5)
        recomputed, _ = policy.chunk_log_prob(obs, horizons, torch.zeros(6), plan[:, :5])
        torch.testing.assert_close(recomputed, sampled[:, 0], rtol=0, atol=1e-5, msg=mode)
    assert policy.training  # the caller's mode is kept; only dropout stays off


def test_gradient_checkpointing_recomputes_the_decoder_in_the_update(mixed_tiny):
    spec = VisionLanguageSpec((3, IMAGE, IMAGE), num_images=2, proprio_dim=4, instructions=MIXED)
    model = ModelConfig(kind="vla", path=str(mixed_tiny), gradient_checkpointing=True)
    policy = build_vla_policy(model, spec, 7, 5)
    assert all(module.training for module in policy.modules())
    layers = policy.backbone.get_decoder().layers
    checkpointed = []
    for layer in layers:
        run = layer._gradient_checkpointing_func
        layer._gradient_checkpointing_func = lambda *a, run=run, **k: (
            checkpointed.append(1) or run(*a, **k)
        )
    obs = mixed_obs(policy, [0, 1]).float()
    log_prob, _ = policy.chunk_log_prob(obs, torch.full((2,), 5), torch.zeros(2),
                                        torch.zeros(2, 5, 7))  # fmt: skip
    log_prob.sum().backward()
    assert len(checkpointed) == len(layers)
    policy.eval()
    assert not any(module.training for module in policy.modules())
