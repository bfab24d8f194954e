"""The clipped surrogate of PPO/GRPO/RLOO over an executed chunk, three ways, and the KL
estimates that watch it.

A chunk of a VLA is 35-70 action tokens. Its probability ratio (`chunk`) is their
product, which leaves any clip range at the first step. The ratio's geometric mean
(`geometric_mean`, GSPO's length normalisation) with the clip range of one token
bounds only the average: 35 tokens each at 1.2 make a chunk ratio of 1.2^35 ≈ 590. So
the geometric mean is clipped in log space with the chunk's range divided by the token
count, which bounds the chunk itself, and `token` clips every token's ratio on its own
and averages the tokens' surrogates (RLinf's and SimpleVLA-RL's choice).

All three clip in log space: `exp(clamp(log r))` is `clamp(r)` for a positive ratio,
and a chunk's log-ratio stays finite where its ratio would overflow. The lower and
upper clips differ where `clip_low` and `clip_high` do (clip-higher, DAPO: a rare
token may rise further than a likely one may fall).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

RATIOS = ("chunk", "geometric_mean", "token")
# A log-ratio's bound before exp: exp(20) is 5e8, far past any clip, and finite, so a
# row that weighs nothing (a masked group's) cannot make its loss inf * 0 = NaN.
MAX_LOG_RATIO = 20.0


@dataclass(frozen=True)
class ClipRange:
    """A ratio may fall to `1 - low` and rise to `1 + high` before its surrogate is
    clipped."""

    low: float
    high: float

    def log_bounds(self, tokens: int = 1) -> tuple[float, float]:
        """The log-ratio's bounds, divided by `tokens` (a geometric mean's over that
        many tokens: its chunk then stays within the range)."""
        return math.log(1.0 - self.low) / tokens, math.log1p(self.high) / tokens


@dataclass(frozen=True)
class Surrogate:
    """Each row's clipped surrogate loss ``[N]`` (the mean of its tokens' where the ratio
    is per token), and each row's share of ratios clipped below and above ``[N]``."""

    loss: torch.Tensor
    clipped_low: torch.Tensor
    clipped_high: torch.Tensor


def clipped_surrogate(
    log_ratio: torch.Tensor, advantage: torch.Tensor, clip: ClipRange, tokens: int = 1
) -> Surrogate:
    """PPO's pessimistic surrogate ``max(-A r, -A clip(r))`` of log-ratios ``[N, ...]``
    (a chunk's ``[N]``, or its tokens' ``[N, chunk, dims]``, each clipped on its own),
    row ``i`` with advantage ``advantage[i]``, clipped in log space to
    ``clip.log_bounds(tokens)``; a row's tokens are averaged (a token-mean: every row
    has as many tokens, so the mean over rows of their means is the mean over tokens)."""
    low, high = clip.log_bounds(tokens)
    bounded = log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    against = -advantage.view(-1, *([1] * (log_ratio.dim() - 1)))
    loss = torch.max(against * bounded.exp(), against * bounded.clamp(low, high).exp())
    with torch.no_grad():
        clipped_low = (log_ratio < low).float()
        clipped_high = (log_ratio > high).float()
    if log_ratio.dim() > 1:
        return Surrogate(loss.flatten(1).mean(1), _row_means(clipped_low), _row_means(clipped_high))
    return Surrogate(loss, clipped_low, clipped_high)


def k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """Schulman's low-variance estimate of KL(q || p) from samples of q, with
    ``log_ratio = log p - log q`` per sample: ``r - 1 - log r``, never negative. With
    q the rollout's policy and p the updated one it is the update's approximate KL;
    with p a reference policy, the KL anchor's per-token penalty (GRPO's)."""
    bounded = log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    return bounded.exp() - 1 - bounded


def per_step_statistics(
    token_log_ratio: torch.Tensor, steps: int, clip: ClipRange
) -> dict[str, torch.Tensor]:
    """Each row's KL (k3) and clip fraction at each of `steps` steps [N] of tokens laid
    out step-major ``[N, steps · chunk, dims]`` (a π0's token per denoising step), as
    ``losses/approx_kl_step{k}`` and ``losses/clip_fraction_step{k}``; none for one
    step. A step that injected no noise in a row (one stochastic step per decision)
    counts 0 for it."""
    if steps <= 1:
        return {}
    low, high = clip.log_bounds(1)
    statistics = {}
    for step, ratio in enumerate(token_log_ratio.unflatten(1, (steps, -1)).unbind(1)):
        statistics[f"losses/approx_kl_step{step}"] = _row_means(k3(ratio))
        statistics[f"losses/clip_fraction_step{step}"] = _row_means(
            ((ratio < low) | (ratio > high)).float()
        )
    return statistics


def _row_means(values: torch.Tensor) -> torch.Tensor:
    return values.flatten(1).mean(1)
