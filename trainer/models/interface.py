"""The contract between the rollout loop and any policy, including large VLA models.

The rollout loop (``trainer.algorithms``) only calls the two methods below, so a large
vision-language-action model (OpenVLA-OFT, pi0 / pi0.5) plugs in by wrapping it in an
adapter that implements ``ChunkedPolicy`` (the token-head VLA and π0 in
``trainer.models.vla`` are two):

- ``sample_plan(obs, horizons, steps=S, chunk=C)`` returns a plan
  ``[B, S, action_dim]`` (``S`` defaults to ``max_horizon``; the rollout asks only
  for the longest horizon among the slots it replans) and the log-prob over the
  env's action dims of each chunk of ``C`` consecutive actions, ``[B, S // C]``. A
  flow or diffusion head (pi0) returns the log-prob of its own sampling chain; an
  autoregressive token head (OpenVLA) returns the sum of its action-token log-probs.
  A model that can only plan one fixed length per forward groups the batch by horizon
  and calls itself once per group, as RLinf's OpenPI ``predict_action_batch`` does.
- ``chunk_log_prob(plan_obs, horizons, offsets, chunk_actions)`` recomputes, with
  gradients, the log-prob and entropy of the chunk that started at ``offsets`` in the
  plan made from ``plan_obs``. It must return exactly what ``sample_plan`` gave for
  the same parameters (``tests/trainer/models`` checks this for the built-in policy).
- A policy whose log-probs need more of a plan than its actions (a π0 recomputes its
  denoising chain) has ``plan_latent_size`` > 0 and ``sample_plan_with_latent``, which
  also returns each plan's latent ``[B, plan_latent_size]``; the plan cache and the
  rollout storage keep it with the plan, and the update passes it back as
  ``plan_latent``. The other policies take ``plan_latent`` and ignore it.
- ``token_log_probs`` (same arguments) gives the same per token ``[B, chunk, env dims]``
  (a token: one action dim of one step), the sum of which is ``chunk_log_prob``: what
  the per-token ratio (``algorithm.ratio: token``), the KL anchor and the per-dim
  entropy read.

Such models at their real size need a GPU; tiny ones of the same families run in the
CPU suite. The built-in ``GaussianChunkPolicy`` (MLP or
CNN encoder) implements the same contract and is what CPU runs use.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class ChunkedPolicy(Protocol):
    action_dim: int
    env_action_dim: int
    max_horizon: int

    def sample_plan(
        self,
        obs: torch.Tensor,
        horizons: torch.Tensor,
        deterministic: bool = False,
        steps: int | None = None,
        chunk: int = 1,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def chunk_log_prob(
        self,
        plan_obs: torch.Tensor,
        horizons: torch.Tensor,
        offsets: torch.Tensor,
        chunk_actions: torch.Tensor,
        plan_latent: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def token_log_probs(
        self,
        plan_obs: torch.Tensor,
        horizons: torch.Tensor,
        offsets: torch.Tensor,
        chunk_actions: torch.Tensor,
        plan_latent: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


def check_action_dims(action_dim: int, env_action_dim: int) -> None:
    """A policy may predict more action dims than its env takes, never fewer."""
    if env_action_dim > action_dim:
        raise ValueError(
            f"the model predicts {action_dim} action dims but the env needs {env_action_dim}"
        )
