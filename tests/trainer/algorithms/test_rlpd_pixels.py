"""RLPD from camera images as RLPD (and DrQ before it) learns from them: the actor reads
the critic's encoder under a stop-gradient, and every update sees randomly shifted
observations and next observations."""

import ast
import dataclasses
import inspect
import itertools
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

from trainer.algorithms.rlpd import (
    EncoderLayoutError,
    RLPDLearner,
    RLPDSettings,
    TanhGaussianActor,
)
from trainer.config.errors import ConfigError
from trainer.config.schema import ExperimentConfig
from trainer.models.encoders import random_shift

SHAPE, ACT, PAD = (3, 16, 16), 2, 4


def frames(rows: int = 16, generator: torch.Generator | None = None) -> dict:
    """A batch as the replay buffers give it: camera frames in uint8."""
    return {
        "obs": torch.randint(0, 256, (rows, *SHAPE), dtype=torch.uint8, generator=generator),
        "action": torch.rand(rows, ACT, generator=generator) * 2 - 1,
        "reward": torch.rand(rows, generator=generator),
        "next_obs": torch.randint(0, 256, (rows, *SHAPE), dtype=torch.uint8, generator=generator),
        "terminal": torch.zeros(rows, dtype=torch.bool),
    }


def pixel_learner(**overrides) -> RLPDLearner:
    torch.manual_seed(0)
    settings = RLPDSettings(hidden_sizes=(32, 32), critic_ensemble=2, **overrides)
    return RLPDLearner(SHAPE, ACT, settings)


def shift_of(shifted: torch.Tensor, image: torch.Tensor, pad: int = PAD) -> tuple[int, int] | None:
    """The (rows, columns) offset by which `shifted` is `image` padded by `pad` pixels
    (edges replicated) and cropped back to its size; None when it is no such crop."""
    height, width = image.shape[-2:]
    padded = F.pad(image[None].float(), (pad, pad, pad, pad), mode="replicate")[0]
    for dy, dx in itertools.product(range(2 * pad + 1), repeat=2):
        if torch.equal(padded[:, dy : dy + height, dx : dx + width], shifted.float()):
            return dy - pad, dx - pad
    return None


# ----- the shared encoder ------------------------------------------------------------


def test_the_actor_sees_through_the_critics_encoder():
    rlpd = pixel_learner()
    obs = frames()["obs"]
    before = rlpd.actor(obs)[0].detach()
    with torch.no_grad():
        for parameter in rlpd.critic.encoder.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    assert not torch.allclose(rlpd.actor(obs)[0], before)


def test_the_actors_loss_does_not_reach_the_shared_encoder_and_the_critics_does():
    """In the joint update, the encoder's gradient is the critic's loss's alone: the
    actor's backward (after the critic's step) adds nothing to it, while it moves the
    actor's own layers."""
    rlpd = pixel_learner(cta_ratio=1, image_augmentation="none")
    encoder = dict(rlpd.critic.encoder.named_parameters())
    after_critic: dict[str, torch.Tensor] = {}
    after_actor: dict[str, torch.Tensor | None] = {}
    actor_grads: dict[str, torch.Tensor | None] = {}
    critic_step, actor_step = rlpd.critic_optimizer.step, rlpd.actor_optimizer.step

    def record_critic(*args, **kwargs):
        after_critic.update({n: p.grad.clone() for n, p in encoder.items()})
        return critic_step(*args, **kwargs)

    def record_actor(*args, **kwargs):
        after_actor.update({n: p.grad for n, p in encoder.items()})
        actor_grads.update({n: p.grad for n, p in rlpd.actor.named_parameters()})
        return actor_step(*args, **kwargs)

    rlpd.critic_optimizer.step, rlpd.actor_optimizer.step = record_critic, record_actor
    rlpd.update(frames)
    # The critic's loss trains the encoder...
    assert all(grad.abs().sum() > 0 for grad in after_critic.values())
    # ... and the actor's leaves its gradient as the critic's loss left it.
    for name, grad in after_critic.items():
        assert after_actor[name] is not None
        torch.testing.assert_close(after_actor[name], grad)
    # The actor's own layers (its projection of the features, its body and head) learn.
    own = [grad for name, grad in actor_grads.items() if not name.startswith("encoder.cnn.conv")]
    assert own and all(grad is not None and grad.abs().sum() > 0 for grad in own)


def test_the_actors_optimiser_does_not_hold_the_shared_encoder():
    rlpd = pixel_learner()
    held = {id(p) for group in rlpd.actor_optimizer.param_groups for p in group["params"]}
    convolutions = list(rlpd.critic.encoder.cnn.conv.parameters())
    assert convolutions and not held & {id(p) for p in convolutions}


def test_without_sharing_each_network_trains_its_own_encoder():
    rlpd = pixel_learner(shared_encoder=False, cta_ratio=1)
    actor_conv = list(rlpd.actor.encoder.cnn.conv.parameters())
    critic_conv = list(rlpd.critic.encoder.cnn.conv.parameters())
    assert not {id(p) for p in actor_conv} & {id(p) for p in critic_conv}
    before = [p.detach().clone() for p in actor_conv]
    rlpd.update(frames)
    assert any(not torch.equal(a, b) for a, b in zip(before, actor_conv, strict=True))


def test_state_observations_are_unaffected_by_either_setting():
    settings = RLPDSettings(hidden_sizes=(8,), critic_ensemble=2)
    rlpd = RLPDLearner(3, ACT, settings)
    assert isinstance(rlpd.actor.encoder, torch.nn.Identity)
    batch = {
        "obs": torch.randn(8, 3), "action": torch.rand(8, ACT) * 2 - 1,
        "reward": torch.rand(8), "next_obs": torch.randn(8, 3),
        "terminal": torch.zeros(8, dtype=torch.bool),
    }  # fmt: skip
    assert torch.equal(rlpd.augment(batch)["obs"], batch["obs"])


# ----- random shifts -----------------------------------------------------------------


def test_a_random_shift_moves_each_image_by_at_most_four_pixels_with_edges_replicated():
    generator = torch.Generator().manual_seed(0)
    image = torch.randint(0, 256, SHAPE, dtype=torch.uint8, generator=generator)
    shifted = random_shift(image.expand(128, *SHAPE), PAD, generator=generator)
    assert shifted.shape == (128, *SHAPE) and shifted.dtype == torch.uint8
    offsets = [shift_of(row, image) for row in shifted]
    assert None not in offsets
    assert all(abs(dy) <= PAD and abs(dx) <= PAD for dy, dx in offsets)  # type: ignore[misc]
    # Per sample: 128 copies of one image come out at most of the 81 offsets.
    assert len(set(offsets)) > 40


def test_a_random_shift_keeps_float_frames_and_is_the_identity_without_padding():
    images = torch.rand(4, *SHAPE)
    shifted = random_shift(images, PAD)
    assert shifted.dtype == images.dtype
    assert all(shift_of(s, i) is not None for s, i in zip(shifted, images, strict=True))
    assert torch.equal(random_shift(images, 0), images)


@pytest.mark.parametrize("augmentation", ["random_shift", "none"])
def test_updates_see_shifted_observations_and_next_observations(augmentation):
    """The critic's loss, the target and the actor's loss are computed on shifted
    frames, each a shift of its own row (obs and next_obs drawn apart); with
    `image_augmentation: none`, on the frames as stored."""
    rlpd = pixel_learner(cta_ratio=1, image_augmentation=augmentation)
    seen: dict[str, list[torch.Tensor]] = {"critic": [], "target": []}
    rlpd.critic.encoder.register_forward_pre_hook(
        lambda _, args: seen["critic"].append(args[0].clone())
    )
    rlpd.target_critic.encoder.register_forward_pre_hook(
        lambda _, args: seen["target"].append(args[0].clone())
    )
    batch = frames(32)
    rlpd.update(lambda: batch)
    # The target critic reads next_obs; the critic reads obs in its loss, then in the
    # actor's loss (and the actor's encoder is the critic's).
    assert len(seen["target"]) == 1 and len(seen["critic"]) >= 2
    for name, inputs in (("next_obs", seen["target"]), ("obs", seen["critic"])):
        for given in inputs:
            offsets = [shift_of(s, raw) for s, raw in zip(given, batch[name], strict=True)]
            assert None not in offsets
            if augmentation == "none":
                assert set(offsets) == {(0, 0)}
            else:
                assert len(set(offsets)) > 10, name
    # One augmented batch per update: the critic's and the actor's losses see the same
    # frames.
    assert all(torch.equal(seen["critic"][0], later) for later in seen["critic"][1:])


# ----- checkpoints and the acting workers ----------------------------------------------


def test_a_pixel_snapshot_continues_identically(tmp_path):
    first, second = pixel_learner(), pixel_learner(init_temperature=0.5)
    first.update(frames)
    torch.save(first.state_dict(), tmp_path / "learner.pt")
    second.load_state_dict(torch.load(tmp_path / "learner.pt"))
    generator = torch.Generator().manual_seed(4)
    data = [frames(generator=generator) for _ in range(4)]
    torch.manual_seed(5)
    a = [first.update(iter(data[i : i + 2]).__next__) for i in (0, 2)]
    torch.manual_seed(5)
    b = [second.update(iter(data[i : i + 2]).__next__) for i in (0, 2)]
    assert a == b
    for x, y in zip(first.actor.parameters(), second.actor.parameters(), strict=True):
        assert torch.equal(x, y)
    # Still one encoder after loading: the actor's convolutions are the critic's.
    assert second.actor.encoder.cnn.conv is second.critic.encoder.cnn.conv


def test_a_checkpoint_of_the_other_encoder_layout_is_refused_with_the_key_named():
    shared, separate = pixel_learner(), pixel_learner(shared_encoder=False)
    with pytest.raises(EncoderLayoutError, match="algorithm.rlpd.shared_encoder: false"):
        shared.load_state_dict(separate.state_dict())
    with pytest.raises(EncoderLayoutError, match="algorithm.rlpd.shared_encoder: true"):
        separate.load_state_dict(shared.state_dict())
    # A checkpoint from before the shared encoder: the actor had one of its own.
    before = separate.state_dict()
    del before["shared_encoder"]
    pixel_learner(shared_encoder=False).load_state_dict(before)
    with pytest.raises(EncoderLayoutError):
        pixel_learner().load_state_dict(before)


def pixel_run(tmp_path: Path, iterations: int = 1, **rlpd) -> ExperimentConfig:
    """A pixel RLPD run on the built-in env's camera that stores transitions only."""
    return ExperimentConfig.model_validate({
        "env": {"camera": True, "image_size": 16, "num_parallel_envs": 2,
                "max_episode_steps": 5, "task_ids": [0]},
        "algorithm": {"name": "rlpd", "rlpd": {"training_starts": 1000, **rlpd}},
        "runner": {"iterations": iterations, "progress": False, "output_dir": str(tmp_path)},
    })  # fmt: skip


def test_resuming_with_the_other_encoder_layout_is_a_config_error_naming_the_key(tmp_path):
    from trainer.runner.rlpd_runner import RLPDRunner

    first = RLPDRunner(pixel_run(tmp_path, shared_encoder=False))
    try:
        first.learn()
    finally:
        first.close()
    resumed = RLPDRunner(pixel_run(tmp_path, iterations=2))  # shared_encoder on
    try:
        with pytest.raises(ConfigError) as raised:
            resumed.learn(resume=True)
    finally:
        resumed.close()
    assert "algorithm.rlpd.shared_encoder" in str(raised.value)


def test_an_evaluation_takes_the_encoder_layout_the_checkpoint_has():
    """A run's config from before the shared encoder does not say its actor had its own;
    its checkpoint still evaluates."""
    from trainer.commands.evaluate import _policy_and_env

    separate = RLPDLearner((3, 16, 16), 7, RLPDSettings(shared_encoder=False))
    state = separate.state_dict()
    del state["shared_encoder"]
    policy, env, *_ = _policy_and_env(pixel_run(Path("unused")), {"learner": state})
    obs = env.reset(0, env.init_states(0)[:2])
    assert torch.equal(
        policy.actor.act(obs, deterministic=True), separate.actor.act(obs, deterministic=True)
    )


def test_an_acting_workers_own_actor_loads_the_shared_actors_weights():
    """Placed env workers act with a `TanhGaussianActor` of their own, sent the
    learner's actor's state: the shared encoder's weights travel in it."""
    rlpd = pixel_learner()
    rlpd.update(frames)
    worker = TanhGaussianActor(SHAPE, ACT, (32, 32))
    worker.load_state_dict(rlpd.actor.state_dict())
    obs = torch.rand(4, *SHAPE)
    assert torch.equal(worker.act(obs, deterministic=True), rlpd.actor.act(obs, deterministic=True))


# ----- settings, config and module structure ---------------------------------------------


def test_the_config_switches_both_and_both_default_on():
    from trainer.config.schema import ExperimentConfig
    from trainer.runner.rlpd_runner import rlpd_settings

    defaults = rlpd_settings(ExperimentConfig.model_validate({"algorithm": {"name": "rlpd"}}))
    assert defaults.shared_encoder and defaults.image_augmentation == "random_shift"
    off = ExperimentConfig.model_validate(
        {"algorithm": {"name": "rlpd", "rlpd": {"shared_encoder": False,
                                                 "image_augmentation": "none"}}}
    )  # fmt: skip
    settings = rlpd_settings(off)
    assert not settings.shared_encoder and settings.image_augmentation == "none"
    with pytest.raises(ValueError, match="image_augmentation"):
        RLPDSettings(image_augmentation="flip")
    assert dataclasses.replace(settings, image_augmentation="random_shift")


def test_the_graph_module_does_not_import_the_learner():
    """rlpd imports rlpd_graph; rlpd_graph takes what it needs of a learner by a
    protocol, so the two do not import each other (not even for type checking)."""
    import trainer.algorithms.rlpd_graph as graph

    tree = ast.parse(Path(inspect.getfile(graph)).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
            imported.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
    assert not {name for name in imported if name.startswith("trainer.algorithms.rlpd")} - {
        "trainer.algorithms.rlpd_graph"
    }
