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

Which steps are stochastic (`stochastic_steps`): ``all`` makes every step a Gaussian
transition and a chunk's log-prob the joint chain's; ``one`` draws, for each decision, one
step to be stochastic while the others follow the ODE, and the log-prob is that step's
(πRL's hybrid ODE-SDE sampling, after MixGRPO, arXiv 2507.21802). With ``one`` the
executed actions carry one step's noise instead of every step's, and the update evaluates
one velocity per row instead of `steps`. The ODE steps are deterministic in the parameters of the
moment: the ratio is the stochastic step's, exact as the joint chain's is, and neither
differentiates through how later steps move the chunk (each step reads its stored state).

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
from typing import Any, Literal

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class FlowSDE:
    steps: int = 4  # denoising steps (RLinf uses 4-5 for RL, 10 for inference)
    noise_level: float = 0.5  # a in σ_t = a·√(t / (1 - t)); 0: the library's ODE
    stochastic_steps: Literal["all", "one"] = "all"

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps: at least 1, got {self.steps}")
        if not (self.noise_level >= 0 and math.isfinite(self.noise_level)):
            raise ValueError(f"noise_level: a finite number >= 0, got {self.noise_level}")
        if self.stochastic_steps not in ("all", "one"):
            raise ValueError(f"stochastic_steps: all or one, got {self.stochastic_steps!r}")

    def draw_stochastic(
        self, batch: int, device: torch.device | str, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Which steps of each row's chain inject noise [B, steps] (1 or 0)."""
        if self.stochastic_steps == "all":
            return torch.ones(batch, self.steps, device=device)
        # Drawn where the generator lives (a seeded CPU generator serves a GPU's rows).
        where = generator.device if generator is not None else device
        step = torch.randint(self.steps, (batch,), generator=generator, device=where)
        return F.one_hot(step.to(device), self.steps).float()

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
    noise to the actions, each transition's log-density [B, steps, chunk, env dims], and
    which steps injected noise [B, steps] (a deterministic step's log-density is 0)."""

    states: torch.Tensor
    step_log_probs: torch.Tensor
    stochastic: torch.Tensor

    @property
    def actions(self) -> torch.Tensor:
        return self.states[-1]

    @property
    def log_probs(self) -> torch.Tensor:
        """Each step's log-prob [B, steps] over the whole chunk and the env's dims."""
        return self.step_log_probs.sum((2, 3))


def prefix_forward(model: Any, inputs: dict[str, torch.Tensor], use_cache: bool = True) -> Any:
    """The prefix's (images, instruction) forward through the PaliGemma: its last hidden
    states and, with `use_cache`, its KV cache."""
    attention_mask = inputs.get("attention_mask")
    position_ids = attention_mask.cumsum(-1) - 1 if attention_mask is not None else None
    embeds = model.model.embed_prefix(
        inputs["input_ids"], inputs["pixel_values"], inputs["pixel_attention_mask"]
    )
    return model.model.vlm(
        inputs_embeds=embeds, attention_mask=attention_mask, position_ids=position_ids,
        token_type_ids=torch.zeros_like(embeds)[:, :, 0], use_cache=use_cache, return_dict=True,
    )  # fmt: skip


def prefix_cache(model: Any, inputs: dict[str, torch.Tensor]) -> tuple[Any, int]:
    """The prefix's KV cache, computed once per decision as `sample_actions` does, and
    its length."""
    cache = prefix_forward(model, inputs).past_key_values
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


def _transition(flow: FlowSDE, x: torch.Tensor, v: torch.Tensor, t, on: torch.Tensor):
    """The step's mean and standard deviation [rows, 1, 1] (0 for the ODE) at time `t`
    (a float, or one per row), the noise injected on the rows where `on` [rows] is 1."""
    dt = -1.0 / flow.steps
    t = torch.as_tensor(t, dtype=x.dtype, device=x.device).reshape(-1, 1, 1)
    floor = torch.clamp(t, max=1.0 - 1.0 / flow.steps)
    sigma = flow.noise_level * torch.sqrt(floor / (1.0 - floor)) * on.to(x.dtype).view(-1, 1, 1)
    drift = v + (sigma.square() / (2 * t)) * (x + (1 - t) * v) if flow.noise_level else v
    return x + drift * dt, sigma * math.sqrt(-dt)


def _log_density(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, dims: int) -> torch.Tensor:
    """Log N(x; mean, std²) of each position and each of the first `dims` action dims
    [rows, chunk, dims]; 0 for a deterministic row (std 0)."""
    noisy = std > 0
    safe = torch.where(noisy, std, torch.ones_like(std))
    z = (x - mean)[..., :dims] / safe
    density = -0.5 * z.square() - torch.log(safe) - 0.5 * math.log(2 * math.pi)
    return torch.where(noisy, density, torch.zeros_like(density))


def step_entropy(flow: FlowSDE) -> list[float]:
    """The entropy of each step's injected noise when the step is stochastic, per
    position and action dim (nats): a Gaussian's, fixed by the noise level and the
    schedule, 0 for the ODE's steps."""
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
    stochastic = flow.draw_stochastic(noise.shape[0], noise.device, generator)
    x, states, log_probs = noise, [noise], []
    for index, t in enumerate(flow.times()):
        velocity = _velocity(model, inputs, cache, length, x, t)
        mean, std = _transition(flow, x, velocity, t, stochastic[:, index])
        if flow.sigma(t):
            step = torch.randn(mean.shape, generator=generator, dtype=mean.dtype,
                               device=mean.device)  # fmt: skip
            x = mean + std * step
        else:
            x = mean
        states.append(x)
        log_probs.append(_log_density(x, mean, std, action_dims))
    return FlowChain(torch.stack(states), torch.stack(log_probs, dim=1), stochastic)


def chain_log_probs(
    model: Any,
    inputs: dict[str, torch.Tensor],
    states: torch.Tensor,
    stochastic: torch.Tensor,
    flow: FlowSDE,
    action_dims: int,
    prefix: Any = None,
) -> torch.Tensor:
    """Each transition's log-density [B, steps, chunk, env dims] of a stored chain under
    the model as it is now, with gradients (the update's side of `sample_chain`);
    `stochastic` [B, steps] says which steps injected noise; `prefix`: the rows'
    `prefix_forward`, when the caller has it already.

    The prefix runs once per row; every step's state is known, so the stochastic steps'
    velocities come from one forward of the action expert over their (row, step) pairs
    (each row's prefix cache gathered once per pair) instead of `steps` forwards one
    after another; a deterministic step's log-density is 0 and needs no velocity."""
    batch, steps = stochastic.shape
    rows, at = stochastic.nonzero(as_tuple=True)  # row-major: each row's steps in order
    log_probs = states.new_zeros(batch, steps, states.shape[2], action_dims)
    if rows.numel() == 0 or not flow.noise_level:
        return log_probs
    cache = (prefix if prefix is not None else prefix_forward(model, inputs)).past_key_values
    cache.batch_select_indices(rows)
    times = torch.tensor(flow.times(), dtype=states.dtype, device=states.device)[at]
    mask = inputs.get("attention_mask")
    velocity = model(
        state=inputs["state"][rows], noise=states[at, rows], timestep=times,
        past_key_values=cache, attention_mask=None if mask is None else mask[rows],
        pixel_attention_mask=inputs["pixel_attention_mask"][rows],
    ).logits  # fmt: skip
    on = torch.ones_like(times)
    mean, std = _transition(flow, states[at, rows], velocity, times, on)
    return log_probs.index_put(
        (rows, at), _log_density(states[at + 1, rows], mean, std, action_dims)
    )
