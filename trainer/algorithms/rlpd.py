"""RLPD's learner (seed 004, after HIL-SERL): soft actor-critic with an ensemble of
critics, LayerNorm in the critics, Polyak-averaged targets, a learned temperature,
and `cta_ratio` updates per round — `cta_ratio - 1` critic-only updates, then one
joint critic + actor + temperature update, each on a fresh batch (drawn half from
the demo buffer by `trainer.data.replay.MixedSampler`).

Transitions: `obs`, `action` (in [-1, 1]), `reward`, `next_obs`, `terminal`. State
observations go to the networks as they are; camera images ([C, H, W], uint8 as the
buffers store them or floats in [0, 1]) through a CNN of trainer.models, as RLPD learns
from pixels (after DrQ): the critics' CNN (shared by the members; the targets have their
own copy) is trained by the critics' loss alone, and the actor reads its convolutions
under a stop-gradient, with a projection of its own (`shared_encoder`); every update
sees its batch's observations and next observations randomly shifted by up to 4 pixels
(`image_augmentation`). Successes are terminal; a time-out is not (its target
bootstraps from `next_obs`, the true final observation).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from trainer.algorithms.rlpd_graph import GraphedRound
from trainer.devices import autocast
from trainer.models.encoders import build_encoder, random_shift

Batch = dict[str, torch.Tensor]
# What an update reads of a batch (a sampler gathers nothing else).
LEARNER_FIELDS = ("obs", "action", "reward", "next_obs", "terminal")
LOG_STD_RANGE = (-5.0, 2.0)
IMAGE_AUGMENTATIONS = ("random_shift", "none")
# DrQ's and RLPD's shift: pad 4 pixels (edges replicated), crop back at random.
SHIFT_PAD = 4


class EncoderLayoutError(ValueError):
    """A checkpoint's actor and this learner's differ in whether they read the critics'
    encoder (`RLPDSettings.shared_encoder`)."""


def shares_encoder(state: dict) -> bool:
    """Whether a learner's saved state (`RLPDLearner.state_dict`) is of an actor that
    reads the critics' encoder; checkpoints from before it could have none."""
    return bool(state.get("shared_encoder", False))


@dataclass(frozen=True)
class RLPDSettings:
    discount: float = 0.99
    tau: float = 0.005  # Polyak step of the target critics
    critic_ensemble: int = 10
    # Members whose minimum makes the target (RLPD's random subset of 2 of 10).
    critic_subsample: int = 2
    layer_norm: bool = True
    hidden_sizes: tuple[int, ...] = (256, 256)
    actor_lr: float = 3e-4
    critic_lr: float = 3e-4
    temperature_lr: float = 3e-4
    init_temperature: float = 0.01
    target_entropy: float | None = None  # default: -action_dim / 2
    cta_ratio: int = 2
    # Subtract α·log π(a'|s') in the target. Off by default, as in HIL-SERL: with a
    # sparse reward of 1 the entropy bonus (several nats per step) swamps it.
    backup_entropy: bool = False
    # On a GPU, replay each round as one captured CUDA graph (trainer.algorithms.rlpd_graph).
    cuda_graph: bool = True
    # Camera images only. The actor reads the critics' convolutions under a stop-gradient
    # (RLPD's and DrQ's pixel agents) rather than training a CNN of its own.
    shared_encoder: bool = True
    # Camera images only: random_shift (every update's obs and next_obs shifted by up to
    # SHIFT_PAD pixels, each row its own shift) or none.
    image_augmentation: str = "random_shift"

    def __post_init__(self) -> None:
        if self.image_augmentation not in IMAGE_AUGMENTATIONS:
            raise ValueError(
                f"image_augmentation: {' or '.join(IMAGE_AUGMENTATIONS)}, "
                f"not {self.image_augmentation!r}"
            )
        if self.cta_ratio < 1:
            raise ValueError(f"cta_ratio: must be at least 1, not {self.cta_ratio}")
        if not 1 <= self.critic_subsample <= self.critic_ensemble:
            raise ValueError(
                f"critic_subsample: must be between 1 and critic_ensemble "
                f"({self.critic_ensemble}), not {self.critic_subsample}"
            )


class EnsembleLinear(nn.Module):
    """`members` independent linear layers applied at once: [E, B, in] → [E, B, out]."""

    def __init__(self, members: int, in_features: int, out_features: int) -> None:
        super().__init__()
        bound = 1 / math.sqrt(in_features)  # nn.Linear's default initialisation
        self.weight = nn.Parameter(torch.empty(members, in_features, out_features))
        self.bias = nn.Parameter(torch.empty(members, 1, out_features))
        nn.init.uniform_(self.weight, -bound, bound)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(self.bias, x, self.weight)


class EnsembleLayerNorm(nn.Module):
    """LayerNorm of each member's features with that member's own scale and bias
    ([E, 1, size] each), as RLPD's vmapped ensemble has: [E, B, size] → [E, B, size]."""

    def __init__(self, members: int, size: int) -> None:
        super().__init__()
        self.size = size
        self.weight = nn.Parameter(torch.ones(members, 1, size))
        self.bias = nn.Parameter(torch.zeros(members, 1, size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(self.bias, F.layer_norm(x, (self.size,)), self.weight)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        # Checkpoints written before each member had its own: one [size] scale and bias
        # shared by all members, which is every member starting from the same values.
        for name in ("weight", "bias"):
            stored = state_dict.get(prefix + name)
            if stored is not None and stored.dim() == 1:
                state_dict[prefix + name] = stored.expand_as(getattr(self, name)).clone()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class PixelEncoder(nn.Module):
    """Camera images to features with trainer.models' CNN; uint8 frames (as the replay
    buffers keep them) are scaled to [0, 1] first."""

    def __init__(self, obs_shape: tuple[int, ...], feature_dim: int) -> None:
        super().__init__()
        self.cnn = build_encoder("cnn", obs_shape, (feature_dim,))
        self.feature_dim = feature_dim

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if obs.dtype == torch.uint8:
            obs = obs.float().div_(255.0)
        return self.cnn(obs)


def observation_encoder(obs_shape: tuple[int, ...], feature_dim: int) -> tuple[nn.Module, int]:
    """The encoder of one network and the width of what it gives: state vectors pass
    through unchanged, images ([C, H, W]) go through a CNN."""
    if len(obs_shape) == 1:
        return nn.Identity(), obs_shape[0]
    if len(obs_shape) == 3:
        encoder = PixelEncoder(obs_shape, feature_dim)
        return encoder, encoder.feature_dim
    raise ValueError(f"rlpd takes state vectors or [C, H, W] images, not shape {obs_shape}")


class CriticEnsemble(nn.Module):
    """Q(s, a) of every member: [E, B]."""

    def __init__(
        self, obs_shape: tuple[int, ...], action_dim: int, members: int,
        hidden: tuple[int, ...], layer_norm: bool,
    ) -> None:  # fmt: skip
        super().__init__()
        self.members = members
        self.encoder, features = observation_encoder(obs_shape, hidden[-1])
        layers: list[nn.Module] = []
        width = features + action_dim
        for size in hidden:
            layers.append(EnsembleLinear(members, width, size))
            if layer_norm:
                layers.append(EnsembleLayerNorm(members, size))
            layers.append(nn.ReLU())
            width = size
        layers.append(EnsembleLinear(members, width, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        x = torch.cat([self.encoder(obs), action], dim=-1)
        x = x.unsqueeze(0).expand(self.members, -1, -1)
        return self.net(x).squeeze(-1)


class TanhGaussianActor(nn.Module):
    """A Gaussian squashed by tanh into [-1, 1], with the change-of-variables term."""

    def __init__(
        self, obs_shape: tuple[int, ...] | int, action_dim: int, hidden: tuple[int, ...]
    ) -> None:
        super().__init__()
        shape = (obs_shape,) if isinstance(obs_shape, int) else tuple(obs_shape)
        self.encoder, width = observation_encoder(shape, hidden[-1])
        layers: list[nn.Module] = []
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, 2 * action_dim)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = self.head(self.body(self.encoder(obs))).chunk(2, dim=-1)
        # clamp's values; its gradient in one kernel, where clamp's backward takes five.
        return mean, F.hardtanh(log_std, *LOG_STD_RANGE)

    def sample(
        self,
        obs: torch.Tensor,
        generator: torch.Generator | None = None,
        with_log_prob: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A reparameterised action and its log-probability [B] (None without
        `with_log_prob`); the noise from `generator` (the global generator when None)."""
        # The network may have run in bf16 (autocast): the distribution's math is fp32.
        mean, log_std = (part.float() for part in self(obs))
        noise = torch.randn(mean.shape, generator=generator, dtype=mean.dtype, device=mean.device)
        raw = torch.addcmul(mean, noise, log_std.exp())
        action = torch.tanh(raw)
        if not with_log_prob:
            return action, None
        # Per dim, log N(raw; mean, std) - log(1 - tanh(raw)^2), the latter written stably
        # as 2 (log 2 - raw - softplus(-2 raw)); its terms gathered as
        # 2 (raw + softplus(-2 raw) - z^2 / 4) - log std - (log(2 pi) / 2 + 2 log 2), which
        # is a third fewer kernels, each one a launch on a GPU.
        per_dim = torch.addcmul(raw + F.softplus(-2 * raw), noise, noise, value=-0.25)
        constant = mean.shape[-1] * (0.5 * math.log(2 * math.pi) + 2 * math.log(2))
        return action, per_dim.sum(-1).mul(2).sub(log_std.sum(-1)).sub(constant)

    @torch.no_grad()
    def act(
        self, obs: torch.Tensor, deterministic: bool = False,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:  # fmt: skip
        if deterministic:
            return torch.tanh(self(obs)[0])
        return self.sample(obs, generator, with_log_prob=False)[0]


class RLPDLearner:
    """The networks, their optimisers and the update schedule."""

    fields = LEARNER_FIELDS

    def __init__(
        self,
        obs_shape: tuple[int, ...] | int,
        action_dim: int,
        settings: RLPDSettings,
        device: torch.device | str = "cpu",
        precision: str = "fp32",
    ) -> None:
        """`obs_shape`: a state vector's width (an int or a 1-tuple) or an image's
        [C, H, W]; `device`: where the networks, their optimisers and the batches are;
        `precision`: fp32, or the networks' forward passes in bf16 under autocast
        (weights, optimizer state, targets, losses and the policy's distribution stay
        fp32)."""
        shape = (obs_shape,) if isinstance(obs_shape, int) else tuple(obs_shape)
        self.settings = settings
        self.device = torch.device(device)
        self.precision = precision
        self.images = len(shape) == 3
        self.shared_encoder = self.images and settings.shared_encoder
        self.shifts_images = self.images and settings.image_augmentation == "random_shift"
        hidden = settings.hidden_sizes
        self.actor = TanhGaussianActor(shape, action_dim, hidden).to(self.device)
        self.critic = CriticEnsemble(
            shape, action_dim, settings.critic_ensemble, hidden, settings.layer_norm
        ).to(self.device)
        if self.shared_encoder:
            # The actor's own convolutions are dropped (built all the same, so that a
            # seed draws the same weights for everything else either way).
            self.actor.encoder.cnn.share_conv(self.critic.encoder.cnn.conv)
        self.target_critic = CriticEnsemble(
            shape, action_dim, settings.critic_ensemble, hidden, settings.layer_norm
        ).to(self.device)
        self.target_critic.load_state_dict(self.critic.state_dict())
        self.target_critic.requires_grad_(False)
        self.log_temperature = nn.Parameter(
            torch.tensor(math.log(settings.init_temperature), device=self.device)
        )
        self.target_entropy = (
            -action_dim / 2 if settings.target_entropy is None else settings.target_entropy
        )
        graphed = settings.cuda_graph and self.device.type == "cuda"
        # Fused Adam: one kernel per step instead of a dozen ops per parameter;
        # capturable (its step count on the device) where a graph replays it.
        adam = {"fused": True, "capturable": graphed}
        # The actor's own parameters: a shared encoder is the critic's to train.
        critic_parameters = {id(p) for p in self.critic.parameters()}
        actor_parameters = [p for p in self.actor.parameters() if id(p) not in critic_parameters]
        self.actor_optimizer = torch.optim.Adam(actor_parameters, lr=settings.actor_lr, **adam)
        self.critic_optimizer = torch.optim.Adam(
            self.critic.parameters(), lr=settings.critic_lr, **adam
        )
        self.temperature_optimizer = torch.optim.Adam(
            [self.log_temperature], lr=settings.temperature_lr, **adam
        )
        self._target_parameters = list(self.target_critic.parameters())
        self._critic_parameters = list(self.critic.parameters())
        self.updates = 0  # critic updates so far
        self.graphed_round: GraphedRound | None = GraphedRound(self) if graphed else None

    def autocast(self) -> contextlib.AbstractContextManager:
        """The networks' forward passes' precision (`precision`)."""
        return autocast(self.device, self.precision, cache=self.graphed_round is None)

    @property
    def temperature(self) -> float:
        return float(self.log_temperature.detach().exp())

    def _alpha(self) -> torch.Tensor:
        """The temperature as a tensor on the device: the update reads no number back."""
        return self.log_temperature.detach().exp()

    def update(self, sample: Callable[[], Batch]) -> dict[str, torch.Tensor]:
        """One round of the schedule; `sample()` gives a fresh mixed batch each call."""
        batches = (sample() for _ in range(self.settings.cta_ratio))
        if self.graphed_round is not None:
            return self.graphed_round.update(list(batches))
        return self.round(batches)

    def round(self, batches: Iterable[Batch]) -> dict[str, torch.Tensor]:
        """`cta_ratio - 1` critic updates, then the joint update, each on the next batch
        (drawn as it is needed when `batches` is a generator)."""
        batches = iter(batches)
        for _ in range(self.settings.cta_ratio - 1):
            self.critic_step(next(batches))
        return self.joint_step(next(batches))

    def augment(self, batch: Batch) -> Batch:
        """`batch` as one update sees it: with `image_augmentation: random_shift`, its
        observations and next observations shifted (each row by its own draw, the two
        apart, as DrQ and RLPD draw them); anything else as it is."""
        if not self.shifts_images:
            return batch
        shifted = {name: random_shift(batch[name], SHIFT_PAD) for name in ("obs", "next_obs")}
        return {**batch, **shifted}

    def critic_step(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One critic update on the soft Bellman target, then the targets' Polyak step."""
        return self._critic_update(self.augment(batch))

    def _critic_update(self, batch: Batch) -> dict[str, torch.Tensor]:
        """`critic_step` on a batch already augmented."""
        target = self.td_target(batch)
        with self.autocast():
            predicted = self.critic(batch["obs"], batch["action"]).float()
        loss = F.mse_loss(predicted, target.expand_as(predicted))
        self.critic_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.critic_optimizer.step()
        self.update_targets()
        self.updates += 1
        return {
            "rlpd/critic_loss": loss.detach(),
            "rlpd/q_predicted": predicted.detach().mean(),
            "rlpd/q_target": target.mean(),
        }

    @torch.no_grad()
    def td_target(self, batch: Batch) -> torch.Tensor:
        """r + γ (1 - terminal) (min over a random subset of target critics of Q(s', a')
        - α log π(a'|s')), a' drawn from the current actor."""
        settings = self.settings
        members = _random_subset(settings.critic_ensemble, settings.critic_subsample, self.device)
        backup_entropy = settings.backup_entropy
        with self.autocast():
            next_action, next_log_prob = self.actor.sample(
                batch["next_obs"], with_log_prob=backup_entropy
            )
            next_q = self.target_critic(batch["next_obs"], next_action)[members]
        next_q = next_q.float().min(0).values
        if backup_entropy:
            next_q = next_q - self._alpha() * next_log_prob
        # A terminal transition's target is its reward alone.
        alive_q = next_q.masked_fill(batch["terminal"].bool(), 0.0)
        return torch.add(batch["reward"], alive_q, alpha=settings.discount)

    def joint_step(self, batch: Batch) -> dict[str, torch.Tensor]:
        """The critic, then the actor against the updated critic, then the temperature,
        all on the same augmented batch."""
        batch = self.augment(batch)
        metrics = self._critic_update(batch)
        # The actor's loss flows through the critic to the actions only: the critic's
        # own weight gradients would be work thrown away.
        self.critic.requires_grad_(False)
        try:
            with self.autocast():
                action, log_prob = self.actor.sample(batch["obs"])
                q = self.critic(batch["obs"], action).float().mean(0)
        finally:
            self.critic.requires_grad_(True)
        assert log_prob is not None
        alpha = self._alpha()
        actor_loss = (alpha * log_prob - q).mean()
        self.actor_optimizer.zero_grad(set_to_none=True)
        actor_loss.backward()
        self.actor_optimizer.step()
        temperature_loss = self.temperature_step(log_prob.detach(), alpha)
        return {
            **metrics,
            "rlpd/actor_loss": actor_loss.detach(),
            "rlpd/temperature": self._alpha(),
            "rlpd/temperature_loss": temperature_loss.detach(),
            "rlpd/entropy": -log_prob.detach().mean(),
        }

    def temperature_step(
        self, log_prob: torch.Tensor, alpha: torch.Tensor | None = None
    ) -> torch.Tensor:
        """One step of the temperature on its loss, -α (mean log π + target entropy),
        which raises it while the policy's entropy (-log π) is below the target and
        lowers it while above; returns the loss. The loss's gradient in log α is the
        loss itself (dα / d log α = α), so it is given to the optimiser as it is: on a
        GPU, backward through it would be a dozen kernels for one number. `alpha`: the
        temperature now, where the caller has it."""
        alpha = self._alpha() if alpha is None else alpha
        loss = -(alpha * (log_prob.mean() + self.target_entropy))
        self.log_temperature.grad = loss
        self.temperature_optimizer.step()
        return loss

    @torch.no_grad()
    def update_targets(self) -> None:
        torch._foreach_lerp_(self._target_parameters, self._critic_parameters, self.settings.tau)

    def _optimizers(self) -> tuple[torch.optim.Optimizer, ...]:
        return self.actor_optimizer, self.critic_optimizer, self.temperature_optimizer

    def state_dict(self) -> dict:
        return {
            "actor": self.actor.state_dict(),
            "critic": self.critic.state_dict(),
            "target_critic": self.target_critic.state_dict(),
            "log_temperature": self.log_temperature.detach().clone(),
            "actor_optimizer": self.actor_optimizer.state_dict(),
            "critic_optimizer": self.critic_optimizer.state_dict(),
            "temperature_optimizer": self.temperature_optimizer.state_dict(),
            "updates": self.updates,
            "shared_encoder": self.shared_encoder,
        }

    def load_state_dict(self, state: dict) -> None:
        saved = shares_encoder(state)
        if saved != self.shared_encoder:
            layout = {True: "reads the critics' encoder", False: "has an encoder of its own"}
            ours = layout[self.shared_encoder]
            raise EncoderLayoutError(
                f"the checkpoint's actor {layout[saved]}, this learner's {ours}: set "
                f"algorithm.rlpd.shared_encoder: {str(saved).lower()} to load it"
            )
        if self.graphed_round is not None:
            # The optimisers get new state tensors: a captured round points at the old.
            self.graphed_round.reset()
        self.actor.load_state_dict(state["actor"])
        self.critic.load_state_dict(state["critic"])
        self.target_critic.load_state_dict(state["target_critic"])
        with torch.no_grad():
            self.log_temperature.copy_(state["log_temperature"])
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.temperature_optimizer.load_state_dict(state["temperature_optimizer"])
        for optimizer in self._optimizers():
            for group in optimizer.param_groups:
                # A saved group brings the flag of the learner that saved it (a CPU run's
                # is False); this learner's graph needs its own.
                group["capturable"] = self.graphed_round is not None
        self.updates = state["updates"]


def _random_subset(size: int, count: int, device: torch.device) -> torch.Tensor:
    """`count` distinct indices below `size`, drawn on `device`. On a GPU, the top
    `count` of uniform draws (two kernels): a permutation there is a sort, the slowest
    launch of an update."""
    if device.type == "cpu":
        return torch.randperm(size, device=device)[:count]
    return torch.rand(size, device=device).topk(count).indices
