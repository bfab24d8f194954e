"""A π0 as a chunked policy: the env's packed rows in, a plan of the env's actions out,
sampled through Flow-SDE (`flow_sde`) so that RL has exact log-probs.

One decision makes a whole chunk (`chunk_size`, 50 for shipped π0s): the prefix
(cameras, instruction) runs once and its KV cache serves every denoising step, as
`sample_actions` does. The plan is the chunk's first `steps` actions, un-normalised and
cut to the env's dims; the plan cache executes the first H of it (H from
`action_horizons_pattern`), a chunk of `num_action_chunks` actions per env step.

A chunk's log-prob is the sum, over the stochastic denoising steps (all of them, or one
drawn per decision: `FlowSDE.stochastic_steps`), of the Gaussian log-densities of the
positions it executes, over the env's action dims. Recomputing it needs the whole chain,
not only the executed actions (each step's velocity reads every position of the previous
state), so a plan carries its chain as its *latent* ([steps + 1, chunk_size,
max_action_dim] flattened, then which steps were stochastic [steps]): the plan cache and
the rollout storage keep it beside the plan's observation, and the update reads it back
(`plan_latent`).

Each token's (one dim of one action) entropy is that of the noise the steps inject: fixed
by the noise level and the schedule, so an entropy bonus has nothing to move; the noise
level is the exploration knob. Behaviour cloning trains the model's own flow-matching
loss (transformers' forward with `actions`) on the env's dims of every position of a demo
chunk inside its episode.

The normalisation statistics are part of the policy's state (`get_extra_state`): a
checkpoint carries those its weights learnt with.

A critic on the prefix's features (`Pi0ValueHead`) asks for them right after the update
has recomputed the same rows' log-probs: with `shares_prefix`, that prefix forward keeps
its pooled features for the critic's next call, which takes them for every row whose
observation is its plan's (the rows at a decision, most of them), so the update runs the
prefix about once per row, not twice.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainer.envs.vision_language import VisionLanguageSpec
from trainer.models.interface import check_action_dims
from trainer.models.vla.flow_sde import (
    FlowSDE,
    chain_log_probs,
    prefix_forward,
    sample_chain,
    step_entropy,
)
from trainer.models.vla.folder_policy import FolderPolicy
from trainer.models.vla.pi0_inputs import Normaliser, observation_inputs


class _SharedPrefix:
    """The last log-prob pass's plan observations and their prefix features, kept for one
    critic call. A copy of the policy (the reference policy, an acting copy) starts
    without them: they hang on the update's graph."""

    def __init__(self) -> None:
        self.rows: tuple[torch.Tensor, bool, torch.Tensor] | None = None

    def __deepcopy__(self, memo: dict) -> _SharedPrefix:
        return _SharedPrefix()


def _pooled(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Hidden states [B, T, width] averaged over the real tokens of `mask` [B, T]."""
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * weights).sum(1) / weights.sum(1)


class Pi0ChunkPolicy(FolderPolicy):
    family = "pi0"

    def __init__(
        self,
        model: nn.Module,
        processor: Any,
        spec: VisionLanguageSpec,
        env_action_dim: int,
        max_horizon: int,
        flow: FlowSDE,
        step_tokens: bool = False,
    ) -> None:
        super().__init__(model)
        config = model.config
        check_action_dims(config.max_action_dim, env_action_dim)
        if max_horizon > config.chunk_size:
            raise ValueError(
                f"the longest horizon ({max_horizon}) exceeds the model's chunk of "
                f"{config.chunk_size} actions"
            )
        self.processor = processor
        self.spec = spec
        self.flow, self.step_tokens = flow, step_tokens
        self.token_steps = flow.steps if step_tokens else 1  # the update's per-step statistics
        # The plan holds the env's actions (un-normalised): the model's dims stay inside.
        self.action_dim = self.env_action_dim = env_action_dim
        self.max_horizon = max_horizon
        self.chunk_size, self.max_dim = config.chunk_size, config.max_action_dim
        self.max_state_dim = config.max_state_dim
        self.width = config.vlm_config.text_config.hidden_size
        self.latent_shape = (flow.steps + 1, self.chunk_size, self.max_dim)
        self.plan_latent_size = math.prod(self.latent_shape) + flow.steps
        self.normaliser = Normaliser.from_processor(processor, spec.proprio_dim, env_action_dim)
        # Every element of the imitation loss, masked by the demos' valid positions.
        config.loss_reduction = "none"
        self.shares_prefix = False  # set by a critic that reads `prefix_features`
        self._shared = _SharedPrefix()
        self.train()

    # ----- the normalisation statistics travel with the weights ------------------------
    def get_extra_state(self) -> dict[str, Any]:
        return {"normaliser": self.normaliser.to_json()}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        self.normaliser = Normaliser.from_json(state["normaliser"])

    def fit_normaliser(self, states: torch.Tensor, actions: torch.Tensor) -> None:
        """Statistics from the demos (proprio [N, S], actions [N, A]) when the folder's
        processor has none for this robot."""
        if self.normaliser.source == "identity":
            self.normaliser = Normaliser.from_demos(states, actions[..., : self.env_action_dim])

    # ----- the forward -----------------------------------------------------------------
    def inputs(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        """The model's inputs for packed rows, on the rows' device (the folder's own
        processor makes the prefix, on the CPU)."""
        made = observation_inputs(
            self.processor, self.spec, obs.detach().cpu(), self.normaliser, self.max_state_dim
        )
        return {name: value.to(obs.device, non_blocking=True) for name, value in made.items()}

    @torch.no_grad()
    def sample_plan_with_latent(
        self,
        obs: torch.Tensor,
        horizons: torch.Tensor,
        deterministic: bool = False,
        steps: int | None = None,
        chunk: int = 1,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A plan [B, steps, env dims], each chunk's log-prob [B, steps // chunk], and
        the chain the plan came from [B, plan_latent_size]. Deterministic plans follow
        the library's ODE (noise level 0) from a random start, as `sample_actions` does."""
        del horizons  # one chunk serves every horizon: the cache executes its first H
        steps = self.max_horizon if steps is None else steps
        if steps % chunk:
            raise ValueError(f"a plan of {steps} steps does not split into chunks of {chunk}")
        batch = obs.shape[0]
        flow = replace(self.flow, noise_level=0.0) if deterministic else self.flow
        noise = torch.randn(batch, self.chunk_size, self.max_dim, device=obs.device)
        chain = sample_chain(self.backbone, self.inputs(obs), noise, flow, self.env_action_dim)
        plan = self.normaliser.actions(chain.actions[:, :steps].float())
        per_action = chain.step_log_probs.float().sum((1, 3))[:, :steps]
        per_chunk = per_action.view(batch, steps // chunk, chunk).sum(-1)
        states = chain.states.transpose(0, 1).reshape(batch, -1)
        return plan, per_chunk, torch.cat([states.float(), chain.stochastic], dim=1)

    def chain_of(self, plan_latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A latent's chain [steps + 1, B, chunk_size, max_action_dim] and which of its
        steps injected noise [B, steps]."""
        batch, steps = plan_latent.shape[0], self.flow.steps
        states = plan_latent[:, :-steps].reshape(batch, *self.latent_shape).transpose(0, 1)
        return states, plan_latent[:, -steps:]

    def sample_plan(
        self,
        obs: torch.Tensor,
        horizons: torch.Tensor,
        deterministic: bool = False,
        steps: int | None = None,
        chunk: int = 1,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        planned = self.sample_plan_with_latent(obs, horizons, deterministic, steps, chunk)
        return planned[0], planned[1]

    def token_log_probs(
        self,
        plan_obs: torch.Tensor,
        horizons: torch.Tensor,
        offsets: torch.Tensor,
        chunk_actions: torch.Tensor,
        plan_latent: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each executed token's log-prob [B, chunk, env dims] (summed over the
        denoising steps), recomputed from the plan's chain with gradients, and its
        injected noise's entropy. With `step_tokens` a token is one dim of one executed
        action at one denoising step [B, steps · chunk, env dims], so the per-token
        ratio clips each step's Gaussian apart."""
        if plan_latent is None:
            raise ValueError("a π0's log-probs are recomputed from its plan's chain")
        chunk, dims = chunk_actions.shape[1], self.env_action_dim
        states, stochastic = self.chain_of(plan_latent)
        inputs = self.inputs(plan_obs)
        prefix = None
        if self.shares_prefix:
            prefix = prefix_forward(self.backbone, inputs)
            features = _pooled(prefix.last_hidden_state, inputs["attention_mask"])
            self._shared.rows = (plan_obs, torch.is_grad_enabled(), features)
        steps = chain_log_probs(
            self.backbone, inputs, states, stochastic, self.flow, dims, prefix=prefix
        )
        positions = offsets.long().unsqueeze(1) + torch.arange(chunk, device=offsets.device)
        where = positions.view(-1, 1, chunk, 1).expand(-1, self.flow.steps, -1, dims)
        taken = steps.float().gather(2, where)  # [B, steps, chunk, dims]
        noise = stochastic * stochastic.new_tensor(step_entropy(self.flow))  # [B, steps]
        entropy = noise.view(*noise.shape, 1, 1).expand_as(taken)
        if self.step_tokens:
            return taken.flatten(1, 2), entropy.flatten(1, 2)
        return taken.sum(1), entropy.sum(1)

    def chunk_log_prob(
        self,
        plan_obs: torch.Tensor,
        horizons: torch.Tensor,
        offsets: torch.Tensor,
        chunk_actions: torch.Tensor,
        plan_latent: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        log_probs, entropy = self.token_log_probs(
            plan_obs, horizons, offsets, chunk_actions, plan_latent
        )
        return log_probs.sum((1, 2)), entropy.sum((1, 2))

    def imitation_loss(
        self, obs: torch.Tensor, plans: torch.Tensor, valid: torch.Tensor
    ) -> torch.Tensor:
        """The flow-matching loss of demo chunks `plans` [B, chunk_size, env dims] (the
        library's forward with `actions`: its time sampling, its target velocity), over
        the env's dims of the `valid` positions [B, chunk_size]."""
        inputs = self.inputs(obs)
        dims = self.env_action_dim
        actions = F.pad(self.normaliser.normalise_actions(plans), (0, self.max_dim - dims))
        out = self.backbone(**inputs, actions=actions)
        per_position = out.loss[..., :dims].float().mean(-1)
        return (per_position * valid).sum() / valid.sum().clamp(min=1)

    def prefix_features(self, obs: torch.Tensor, detached: bool = False) -> torch.Tensor:
        """The prefix's last hidden states averaged over its real tokens [B, width]: what
        the critic reads, `detached` from the backbone's graph or not. A row whose
        observation is the one the last log-prob pass read for it (`shares_prefix`)
        takes that pass's features: the same forward, and one graph for both losses,
        when the pass ran in the grad mode asked for (any mode serves detached rows)."""
        shared, self._shared.rows = self._shared.rows, None
        grad = torch.is_grad_enabled() and not detached
        with torch.set_grad_enabled(grad):
            usable = shared is not None and shared[0].shape == obs.shape
            if not usable or (not detached and shared[1] != grad):
                return self._prefix_features(obs)
            plan_obs, _, features = shared
            features = features.detach() if detached else features
            fresh = (plan_obs != obs).flatten(1).any(1).nonzero().squeeze(1)
            if fresh.numel() == 0:
                return features
            fresh_features = self._prefix_features(obs[fresh]).to(features.dtype)
            return features.index_put((fresh,), fresh_features)

    def _prefix_features(self, obs: torch.Tensor) -> torch.Tensor:
        inputs = self.inputs(obs)
        hidden = prefix_forward(self.backbone, inputs, use_cache=False).last_hidden_state
        return _pooled(hidden, inputs["attention_mask"])
