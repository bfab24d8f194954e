"""Flow-SDE: a flow-matching policy's denoising loop made a chain of Gaussian
transitions, so that RL has a stochastic policy with exact likelihoods (πRL,
arXiv 2510.25889; Flow-GRPO, arXiv 2505.05470).

transformers' π0 (`PI0ForConditionalGeneration.sample_actions`) integrates the ODE
``dx/dt = v(x, t)`` from noise at t = 1 to actions at t = 0 in `steps` Euler steps of
``dt = -1/steps``, reusing the prefix's KV cache at every step. With the convention
``x_t = t·noise + (1 - t)·actions`` (``v = noise - actions``) the score is
``-(x + (1 - t)·v) / t``, and the reverse-time SDE with the same marginals is

    dx = [v + σ_t² / (2t) · (x + (1 - t)·v)] dt + σ_t dW,   σ_t = a·√(t / (1 - t))

so each step is a Gaussian ``N(mean, σ_t²·|dt|)`` around the drift's Euler step. The
noise level ``a`` = 0 gives back the ODE step, which is exactly the library's loop
(`tests/trainer/models/test_pi0_family.py` holds it to 1e-5). σ_t is read at
``min(t, 1 - |dt|)``: at the first step t = 1 it would be infinite.

Each transition is a diagonal Gaussian, so its log-density is a sum over the chunk's
positions and action dims; the chain keeps it per step, position and dim (over the env's
action dims only: the padded dims up to `max_action_dim` never reach the env, so their
noise says nothing of what the policy did). The policy (`pi0_policy`) sums it over the
denoising steps and over the positions a chunk executes, as RLinf's πRL does: positions
the env never executes and the padded dims are sampled all the same, as the sampler's
own noise. Recomputing a stored chain runs the same steps on the same inputs with
gradients: the update's log-probs equal the rollout's for the same parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class FlowSDE:
    steps: int = 4  # denoising steps (RLinf uses 4-5 for RL, 10 for inference)
    noise_level: float = 0.5  # a in σ_t = a·√(t / (1 - t)); 0: the library's ODE

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps: at least 1, got {self.steps}")
        if not (self.noise_level >= 0 and math.isfinite(self.noise_level)):
            raise ValueError(f"noise_level: a finite number >= 0, got {self.noise_level}")

    def times(self) -> list[float]:
        """Each step's t, from 1 down (the library's schedule)."""
        return [1.0 - step / self.steps for step in range(self.steps)]

    def sigma(self, t: float) -> float:
        dt = 1.0 / self.steps
        t = min(t, 1.0 - dt)
        return self.noise_level * math.sqrt(t / (1.0 - t)) if self.noise_level else 0.0


@dataclass
class FlowChain:
    """A sampled chain: `states` [steps + 1, B, chunk, max_action_dim] from the starting
    noise to the actions, and each transition's log-density [B, steps, chunk, env dims]."""

    states: torch.Tensor
    step_log_probs: torch.Tensor

    @property
    def actions(self) -> torch.Tensor:
        return self.states[-1]

    @property
    def log_probs(self) -> torch.Tensor:
        """Each step's log-prob [B, steps] over the whole chunk and the env's dims."""
        return self.step_log_probs.sum((2, 3))


def prefix_cache(model: Any, inputs: dict[str, torch.Tensor]) -> tuple[Any, int]:
    """The prefix's (images, instruction) KV cache, computed once per decision as
    `sample_actions` does, and its length."""
    attention_mask = inputs.get("attention_mask")
    position_ids = attention_mask.cumsum(-1) - 1 if attention_mask is not None else None
    embeds = model.model.embed_prefix(
        inputs["input_ids"], inputs["pixel_values"], inputs["pixel_attention_mask"]
    )
    cache = model.model.vlm(
        inputs_embeds=embeds, attention_mask=attention_mask, position_ids=position_ids,
        token_type_ids=torch.zeros_like(embeds)[:, :, 0], use_cache=True, return_dict=True,
    ).past_key_values  # fmt: skip
    return cache, cache.get_seq_length()


def _velocity(model: Any, inputs: dict, cache: Any, length: int, x: torch.Tensor, t: float):
    batch = x.shape[0]
    time = torch.tensor(t, dtype=torch.float32, device=x.device).expand(batch)
    out = model(
        state=inputs["state"], noise=x, timestep=time, past_key_values=cache,
        attention_mask=inputs.get("attention_mask"),
        pixel_attention_mask=inputs["pixel_attention_mask"],
    )  # fmt: skip
    cache.crop(length)  # the prefix alone: no step attends to an earlier step
    return out.logits


def _transition(flow: FlowSDE, x: torch.Tensor, v: torch.Tensor, t: float):
    """The step's mean and standard deviation (a float; 0 for the ODE)."""
    dt = -1.0 / flow.steps
    sigma = flow.sigma(t)
    drift = v + (sigma**2 / (2 * t)) * (x + (1 - t) * v) if sigma else v
    return x + drift * dt, sigma * math.sqrt(-dt)


def _log_density(x: torch.Tensor, mean: torch.Tensor, std: float, dims: int) -> torch.Tensor:
    """Log N(x; mean, std²) of each position and each of the first `dims` action dims
    [B, chunk, dims]; 0 for a deterministic step."""
    if std == 0.0:
        return torch.zeros_like(x[..., :dims])
    z = (x - mean)[..., :dims] / std
    return -0.5 * z.square() - math.log(std) - 0.5 * math.log(2 * math.pi)


def step_entropy(flow: FlowSDE) -> list[float]:
    """The entropy of each step's injected noise, per position and action dim (nats): a
    Gaussian's, fixed by the noise level and the schedule, 0 for the ODE's steps."""
    dt = 1.0 / flow.steps
    return [
        0.5 * math.log(2 * math.pi * math.e * flow.sigma(t) ** 2 * dt) if flow.sigma(t) else 0.0
        for t in flow.times()
    ]


@torch.no_grad()
def sample_chain(
    model: Any,
    inputs: dict[str, torch.Tensor],
    noise: torch.Tensor,
    flow: FlowSDE,
    action_dims: int,
    generator: torch.Generator | None = None,
) -> FlowChain:
    """Denoise `noise` ([B, chunk, max_action_dim]) with the Flow-SDE's steps."""
    cache, length = prefix_cache(model, inputs)
    x, states, log_probs = noise, [noise], []
    for t in flow.times():
        mean, std = _transition(flow, x, _velocity(model, inputs, cache, length, x, t), t)
        if std:
            step = torch.randn(mean.shape, generator=generator, dtype=mean.dtype,
                               device=mean.device)  # fmt: skip
            x = mean + std * step
        else:
            x = mean
        states.append(x)
        log_probs.append(_log_density(x, mean, std, action_dims))
    return FlowChain(torch.stack(states), torch.stack(log_probs, dim=1))


def chain_log_probs(
    model: Any,
    inputs: dict[str, torch.Tensor],
    states: torch.Tensor,
    flow: FlowSDE,
    action_dims: int,
) -> torch.Tensor:
    """Each transition's log-density [B, steps, chunk, env dims] of a stored chain under
    the model as it is now, with gradients (the update's side of `sample_chain`).

    The prefix runs once per row; every step's state is known, so the steps' velocities
    come from one forward of the action expert over B × steps rows (each row's prefix
    cache repeated once per step) instead of `steps` forwards one after another."""
    batch, steps = states.shape[1], flow.steps
    cache, _ = prefix_cache(model, inputs)
    cache.batch_repeat_interleave(steps)  # row b's cache at rows b·steps … b·steps + steps-1
    x = states[:-1].transpose(0, 1).flatten(0, 1)  # the same order: row-major, then step
    times = torch.tensor(flow.times(), dtype=torch.float32, device=x.device).repeat(batch)

    def each_step(value: torch.Tensor) -> torch.Tensor:
        return value.repeat_interleave(steps, dim=0)

    mask = inputs.get("attention_mask")
    velocity = model(
        state=each_step(inputs["state"]), noise=x, timestep=times, past_key_values=cache,
        attention_mask=None if mask is None else each_step(mask),
        pixel_attention_mask=each_step(inputs["pixel_attention_mask"]),
    ).logits.view(batch, steps, *x.shape[1:])  # fmt: skip
    log_probs = []
    for index, t in enumerate(flow.times()):
        mean, std = _transition(flow, states[index], velocity[:, index], t)
        log_probs.append(_log_density(states[index + 1], mean, std, action_dims))
    return torch.stack(log_probs, dim=1)
