"""The shared rollout side and clipped policy-gradient update of PPO, GRPO and RLOO.

The shape follows rsl_rl: ``act`` chooses actions and starts a transition,
``process_env_step`` completes and stores it, ``compute_returns`` turns a batch of
trajectories into advantages, ``update`` runs minibatch epochs. Subclasses differ only
in ``compute_returns`` (and PPO in having a critic).
"""

from __future__ import annotations

import contextlib
import copy
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from trainer.algorithms.bootstrap import bootstrap_timeouts
from trainer.algorithms.collective import Collective
from trainer.algorithms.decision_graph import GraphedDecisions, graphable
from trainer.algorithms.gradient_buckets import DEFAULT_CAP_BYTES, GradientBuckets
from trainer.algorithms.step_graph import GraphedSteps
from trainer.algorithms.trust_region import ClipRange, clipped_surrogate, k3, per_step_statistics
from trainer.data.rollout_storage import (
    PER_COPY,
    PackedRows,
    RolloutStorage,
    Trajectories,
    Transition,
)
from trainer.devices import HostToDevice, autocast, to_device_async
from trainer.envs.vector_env import EnvStep
from trainer.models.critic import optimizer_state_with_plan_inputs, split_optimizer_group
from trainer.models.plan_cache import ChunkDraw, PlanCache, SpareCaches, decide
from trainer.models.policy import GaussianChunkPolicy
from trainer.models.trained_state import load_policy_checkpoint, policy_checkpoint


@dataclass
class OnPolicySettings:
    """Hyperparameters of the update; see ``trainer.config`` for what each means."""

    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_ratio: float = 0.2
    # The ratio's lower and upper clips, where they differ (clip-higher: a rare token may
    # rise further than a likely one may fall); None: `clip_ratio`.
    clip_ratio_low: float | None = None
    clip_ratio_high: float | None = None
    value_clip: float | None = None
    value_loss_coef: float = 0.5
    entropy_coef: float = 0.0
    target_kl: float | None = None
    update_epochs: int = 4
    num_minibatches: int = 4
    learning_rate: float = 3e-4
    # The critic's own parameters' step size; None: `learning_rate`.
    critic_learning_rate: float | None = None
    max_grad_norm: float = 1.0
    # None: the algorithm's own default (PPO normalises its GAE advantages; GRPO and
    # RLOO do not, theirs are already relative to their group).
    normalize_advantages: bool | None = None
    group_size: int = 1
    use_plan_reward: bool = False
    plan_reward_coef: float = 0.0
    base_h: float = 5.0
    bootstrap_timeouts: bool = True
    # What is clipped (trainer/algorithms/trust_region.py): "chunk", the probability
    # ratio of a whole chunk (the product of its tokens', a token being one dim of one
    # action); "geometric_mean", that ratio's geometric mean over its tokens, clipped
    # in log space by the chunk's range over the token count; "token", every token's
    # ratio clipped on its own, the tokens' surrogates averaged.
    ratio: str = "chunk"
    # Weight of a per-token KL (k3) to a frozen copy of the policy the update started
    # from (the SFT policy of an RL run); 0: no anchor, and no copy is kept.
    kl_coef: float = 0.0
    # GRPO/RLOO: "rows" (each decision weighs the same) or "episodes" (each episode
    # weighs the same, its decisions sharing that weight).
    loss_aggregation: str = "rows"
    lr_warmup_updates: int = 0
    # On a GPU, replay each minibatch step from a captured CUDA graph (step_graph.py).
    cuda_graph: bool = True
    # On a GPU, replay each rollout decision from a captured CUDA graph (decision_graph.py).
    rollout_cuda_graph: bool = True

    def clip_range(self) -> ClipRange:
        """The ratio's clips: `clip_ratio` on the sides not set apart."""
        low, high = self.clip_ratio_low, self.clip_ratio_high
        return ClipRange(
            self.clip_ratio if low is None else low, self.clip_ratio if high is None else high
        )


# The statistic that says whether a step's own rows weighed anything (see _minibatch_step).
OWN_ROWS = "own_rows"
# The minibatch columns of each token's log-prob under the rollout's policy and under
# the KL anchor's reference, worked out once per update (`update_rows`).
TOKEN_LOG_PROB = "token_log_prob"
REFERENCE_LOG_PROB = "reference_log_prob"
_CRITIC_BATCH_ELEMENTS = 2**24  # observation floats per critic call when valuing a round
# What recomputes an executed chunk's log-probs: the plan's observation and horizon, where
# the chunk starts in the plan, its actions, and the plan's latent (a π0's chain).
CHUNK_INPUTS = ("plan_obs", "plan_horizon", "chunk_offset", "actions", "plan_latent")


@torch.no_grad()
def recompute_token_log_probs(
    policy: nn.Module, samples: dict[str, torch.Tensor], parts: int
) -> torch.Tensor:
    """``[N, chunk, env dims]``: each token's log-prob under `policy` of the executed
    chunks of `samples`, computed in `parts` batches (some empty where there are fewer
    rows), in float32."""
    rows = torch.arange(samples["log_prob"].shape[0], device=samples["log_prob"].device)
    found = []
    for part in rows.tensor_split(parts):
        log_probs, _ = policy.token_log_probs(
            *(samples[name].index_select(0, part) for name in CHUNK_INPUTS)
        )
        found.append(log_probs.float())
    return torch.cat(found)


def frozen_copy(policy: nn.Module) -> nn.Module:
    """A copy of `policy` that never trains. Its frozen parameters (a base model under
    LoRA adapters, a frozen vision tower) are the policy's own tensors, not copies:
    they never change, and a VLA's base is most of its memory."""
    shared = {id(p): p for p in policy.parameters() if not p.requires_grad}
    copied = copy.deepcopy(policy, memo=shared)
    return copied.requires_grad_(False)


@dataclass
class RolloutState:
    """A round in progress: its plans, its storage, the decision awaiting its env step."""

    plan_cache: PlanCache | None = None
    storage: RolloutStorage | None = None
    pending: tuple[torch.Tensor, ChunkDraw] | None = None


class Decider(Protocol):
    """Where a rank's decisions are made when not in its own process."""

    def start_round(
        self, horizons: torch.Tensor, policy: nn.Module, version: int, seed: int
    ) -> None: ...

    def act(self, obs: torch.Tensor) -> ChunkDraw: ...

    def device_metrics(self) -> dict[str, float]:
        """The deciding process's `trainer.devices.device_metrics`."""
        ...


class OnPolicyAlgorithm(ABC):
    name = "on_policy"
    normalizes_advantages = True  # when the settings leave it to the algorithm

    def __init__(
        self,
        policy: GaussianChunkPolicy,
        critic: nn.Module | None,
        settings: OnPolicySettings,
        chunk: int,
        generator: torch.Generator | None = None,
        device: torch.device | str = "cpu",
        precision: str = "fp32",
    ) -> None:
        """`device`: where the models, the rollout's storage and the update live (the
        envs stay on the CPU); `precision`: fp32, or bf16 forward passes (autocast)."""
        self.device = torch.device(device)
        self.precision = precision
        self.policy = policy.to(self.device)
        self.critic = critic.to(self.device) if critic is not None else None
        self.settings = settings
        self.chunk = chunk
        # The steps a row's tokens are laid out over (a π0's `step_tokens`: a token per
        # denoising step), each with its own KL and clip fraction; 1 for other policies.
        self.token_steps: int = getattr(policy, "token_steps", 1)
        # A CPU generator on every device: shuffles and seeds are the same draws on a
        # GPU as on the CPU, and only indices cross to the device.
        self.generator = generator
        self.to_device = HostToDevice(self.device)
        can_graph = graphable(policy, self.device)
        graphed = settings.cuda_graph and can_graph
        self.step_graphs: GraphedSteps | None = GraphedSteps(self) if graphed else None
        # The KL anchor's frozen copy of the starting policy, made at the first update
        # (after `init_from` has loaded it) and only when `kl_coef` asks for it.
        self.reference: nn.Module | None = None
        self.decision_graphs: GraphedDecisions | None = (
            GraphedDecisions(self.device) if settings.rollout_cuda_graph and can_graph else None
        )
        self.optimizer = self._make_optimizer()
        self.optimizer_steps = 0  # taken so far, for the step size's warmup
        # The other actor ranks this one trains with (none by default); the runner
        # sets it. Gradients, advantage statistics and early stops are agreed through it.
        self.collective = Collective()
        self.plan_cache: PlanCache | None = None
        self.spare_plan_caches = SpareCaches()
        self.storage: RolloutStorage | None = None
        self._pending: tuple[torch.Tensor, ChunkDraw] | None = None
        # The rank's rollout worker, when its placement gives it one (the runner sets
        # it): decisions are made there with the weights of `policy_version`.
        self.decider: Decider | None = None
        self.policy_version = 0  # counts the policy's changes (updates, loads)
        self._buckets: GradientBuckets | None = None
        self.gradient_bucket_bytes = DEFAULT_CAP_BYTES
        # What the rollout computes with: the models themselves, or full copies of them
        # once they are sharded (`shard`).
        self.acting_policy: GaussianChunkPolicy = self.policy
        self.acting_critic: nn.Module | None = self.critic
        self.sharded = False

    def _make_optimizer(self) -> torch.optim.Optimizer:
        policy_lr, critic_lr = self._base_learning_rates()
        trained = [p for p in self.policy.parameters() if p.requires_grad]
        groups = [{"params": trained, "lr": policy_lr}]
        if self.critic is not None:  # its own group, last: see _saved_optimizer_state
            groups.append({"params": list(self.critic.parameters()), "lr": critic_lr})
        # Fused on every device: one kernel per step (on the CPU a quarter of the
        # multi-tensor loop's time), and the only Adam that can be told on the device to
        # skip a step (`found_inf`, see _minibatch_step); capturable (its step count on
        # the device) where a graph replays it.
        return torch.optim.Adam(
            groups, fused=True,
            capturable=self.step_graphs is not None and self.step_graphs.capture,
        )  # fmt: skip

    def step_optimizer(self) -> None:
        """One optimizer step, its step size warmed up over the first
        `lr_warmup_updates` steps: Adam's first steps are full-size whatever the
        gradient's noise, which can throw a pretrained policy far off at once."""
        warmup = self.settings.lr_warmup_updates
        self.optimizer_steps += 1
        if warmup:
            scale = min(1.0, self.optimizer_steps / warmup)
            for group, lr in zip(
                self.optimizer.param_groups, self._base_learning_rates(), strict=False
            ):
                group["lr"] = lr * scale
        self.optimizer.step()

    def _base_learning_rates(self) -> list[float]:
        """The step size of each optimizer group: the policy's, then the critic's."""
        s = self.settings
        critic = s.learning_rate if s.critic_learning_rate is None else s.critic_learning_rate
        return [s.learning_rate, critic]

    def shard(self) -> None:
        """`actor.strategy: fsdp`: shard the policy and critic over the collective's
        ranks (trainer/algorithms/sharding.py), keeping full copies for the rollout.
        Every rank calls it, with rank 0's weights already everywhere."""
        if self.collective.world_size == 1 or self.sharded:
            return
        import trainer.algorithms.sharding as sharding  # torch.distributed: only then

        mesh = sharding.device_mesh(self.device, self.collective.world_size)
        self.acting_policy = sharding.acting_copy(self.policy)
        sharding.shard(self.policy, mesh)
        if self.critic is not None:
            self.acting_critic = sharding.acting_copy(self.critic)
            sharding.shard(self.critic, mesh)
        self.step_graphs = None  # sharded steps gather and scatter across ranks: eager
        self.optimizer = self._make_optimizer()
        self.optimizer_steps = 0  # taken so far, for the step size's warmup
        self.sharded = True

    def _refresh_acting(self) -> None:
        import trainer.algorithms.sharding as sharding

        sharding.refresh(self.acting_policy, self.policy)
        if self.critic is not None:
            sharding.refresh(self.acting_critic, self.critic)

    # ----- rollout -------------------------------------------------------------
    def swap_rollout(self, state: RolloutState) -> RolloutState:
        """Make `state` the rollout in progress and return the one it replaces: a
        pipelined round keeps one per stage of env copies and alternates between them."""
        previous = RolloutState(self.plan_cache, self.storage, self._pending)
        self.plan_cache, self.storage = state.plan_cache, state.storage
        self._pending = state.pending
        return previous

    def start_round(self, horizons: torch.Tensor, num_steps: int) -> None:
        """New episodes begin: fresh plans for every slot, empty storage. Rounds with
        the same horizons share the plan cache's schedule (`SpareCaches`)."""
        self.plan_cache = self.spare_plan_caches.cache_for_round(
            self.plan_cache, horizons, self.chunk, self.acting_policy.max_horizon, self.device
        )
        self.storage = RolloutStorage(num_steps, int(horizons.shape[0]), self.chunk, self.device)
        if self.decider is not None:
            seed = int(torch.randint(2**62, (1,), generator=self.generator))
            self.decider.start_round(horizons, self.acting_policy, self.policy_version, seed)

    def autocast(self) -> contextlib.AbstractContextManager:
        """The forward passes' precision (`precision`)."""
        graphs = self.step_graphs is not None or self.decision_graphs is not None
        return autocast(self.device, self.precision, cache=not graphs)

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        """Replan the slots whose plan is used up, return the env's part of each chunk
        (on the CPU, where envs step); in the rank's rollout worker when it has one
        (`decider`).

        Only the policy runs here: the critic does not choose actions, so the round's
        values come from one batched call in ``finish_round`` (same parameters, same
        values) instead of one call per decision.
        """
        if self.decider is not None:
            draw = self.decider.act(obs).to(self.device)
            obs = self.to_device("obs", obs)
        else:
            obs = self.to_device("obs", obs)
            assert self.plan_cache is not None, "start_round() first"
            deciding = decide if self.decision_graphs is None else self.decision_graphs.decide
            with self.autocast():
                draw = deciding(self.acting_policy, self.plan_cache, obs, self.chunk)
        self._pending = (obs, draw)
        dims = self.acting_policy.env_action_dim
        actions = draw.actions if draw.actions.shape[2] == dims else draw.actions[..., :dims]
        return actions.cpu()  # the step's one transfer back

    def process_env_step(self, step: EnvStep) -> None:
        assert self._pending is not None and self.storage is not None and self.plan_cache
        obs, draw = self._pending
        # The step arrives from the CPU envs: its flags are read there (no sync with
        # the device), and its per-copy numbers cross in one copy, in `PER_COPY` order.
        done = step.done
        timeouts = step.truncated & ~step.terminated
        env_reward = step.reward.float()
        intervened, held = step.intervened, step.held
        if intervened is None or held is None:  # an env without an operator or safety rules
            none = torch.zeros_like(done)
            intervened = none if intervened is None else intervened
            held = none if held is None else held
        columns = {
            "reward": env_reward, "env_reward": env_reward,
            "executed_actions": step.executed_actions, "done": done, "timeout": timeouts,
            "success": step.success, "intervened": intervened, "held": held,
        }  # fmt: skip
        per_copy = self.to_device.stack("per_copy", tuple(columns[name] for name in PER_COPY))
        if self.critic is not None and self.settings.bootstrap_timeouts:
            # The time-out bootstrap, added on the device: nothing comes back per step.
            reward = per_copy[PER_COPY.index("reward")]
            bootstrapped = bootstrap_timeouts(
                reward, timeouts, step.final_observation, step.obs, self._values,
                self.settings.gamma, partial(to_device_async, device=self.device),
                horizons=draw.horizons, offsets=draw.offsets, chunk=self.chunk,
            )  # fmt: skip
            if bootstrapped is not reward:
                reward.copy_(bootstrapped)
        self.storage.add(
            Transition(obs, draw.actions, draw.offsets, draw.log_prob, per_copy, draw.plan_latent)
        )
        self._pending = None

    def _values(
        self, obs: torch.Tensor, horizons: torch.Tensor, offsets: torch.Tensor
    ) -> torch.Tensor:
        """The critic's values of observations on the device at their plan positions
        (the time-out bootstrap's)."""
        assert self.acting_critic is not None
        with self.autocast():
            return self.acting_critic(obs, horizons, offsets).float()

    def finish_round(
        self, task_id: int, init_state_index: torch.Tensor, group_index: torch.Tensor
    ) -> Trajectories:
        assert self.storage is not None and self.plan_cache is not None
        horizons = self.plan_cache.horizons
        init_state_index = init_state_index.to(self.device)
        group_index = group_index.to(self.device)
        return self.attach_values(
            self.storage.finish(task_id, init_state_index, group_index, horizons)
        )

    @torch.no_grad()
    def attach_values(self, trajectories: Trajectories) -> Trajectories:
        """``V(obs, H, offset)`` of every valid row, batched (one call for a round of
        state vectors); 0 elsewhere, and everywhere for algorithms without a critic."""
        critic = self.acting_critic
        if critic is None:
            return trajectories
        obs = trajectories.obs
        # Row indices into the flattened [T * B] rows: selecting and writing rows by
        # index is several times faster on the CPU than boolean-mask indexing.
        rows = trajectories.valid.view(-1).nonzero().squeeze(1)  # never empty
        valid_obs = obs.view(-1, *obs.shape[2:]).index_select(0, rows)
        horizons = trajectories.plan_horizon.reshape(-1).index_select(0, rows)
        offsets = trajectories.chunk_offset.reshape(-1).index_select(0, rows)
        # Bounded batches: a round of camera images is large, its activations larger.
        batch = max(1, _CRITIC_BATCH_ELEMENTS // obs.shape[2:].numel())
        with self.autocast():
            if len(rows) <= batch:
                values = critic(valid_obs, horizons, offsets)
            else:
                parts = (valid_obs.split(batch), horizons.split(batch), offsets.split(batch))
                values = torch.cat([critic(*part) for part in zip(*parts, strict=True)])
        flat = torch.zeros(obs.shape[0] * obs.shape[1], device=obs.device)
        flat.index_copy_(0, rows, values.float())
        return replace(trajectories, value=flat.view(obs.shape[:2]))

    # ----- learning ------------------------------------------------------------
    def trajectory_scores(self, batch: Trajectories) -> torch.Tensor:
        """What a trajectory scored, for the group filter: the policy's own success."""
        return batch.policy_success.float()

    @abstractmethod
    def compute_returns(self, batch: Trajectories) -> Trajectories:
        """Fill ``advantage`` (and ``returns`` for a critic) of a collected batch."""

    def update(self, batch: Trajectories) -> dict[str, float]:
        return self.update_rows(batch.training_samples())

    def update_rows(self, samples: dict[str, torch.Tensor]) -> dict[str, float]:
        """Clipped policy-gradient epochs over shuffled minibatches of valid rows.

        Rows of masked groups (loss mask 0) stay in the batch with weight 0, so the
        batch keeps exactly ``data_batch_size`` trajectories. With ``target_kl`` set,
        the update stops as soon as a minibatch's approximate KL (`losses/approx_kl`:
        per token with the per-token ratio, else per chunk) exceeds it, before that
        minibatch's gradient step. Statistics stay on the device until the end: the
        update reads them back once.
        """
        s = self.settings
        self.policy_version += 1
        if "plan_latent" not in samples:  # rows made by hand (a bench): no plan has one
            samples["plan_latent"] = samples["obs"].new_zeros(samples["obs"].shape[0], 0)
        normalize = s.normalize_advantages
        if normalize is None:
            normalize = self.normalizes_advantages
        if normalize:
            adv = samples["advantage"]
            # Over the rows the clipped loss takes (as rsl_rl and CleanRL do): a human's
            # rows weigh nothing there, so they must not shift or scale the policy's.
            # Statistics over every rank's rows, so all ranks scale alike.
            weight = samples["policy_weight"]
            moments = self.collective.sum_tensor(
                torch.stack([(adv * weight).sum(), (adv**2 * weight).sum(), weight.sum()])
            )
            mean = moments[0] / moments[2].clamp(min=1e-8)
            std = (moments[1] / moments[2].clamp(min=1e-8) - mean**2).clamp(min=0).sqrt()
            # Without policy rows the advantages are left as they are (no sync to ask).
            normalized = (adv - mean) / (std + 1e-8)
            samples["advantage"] = torch.where(moments[2] > 0, normalized, adv)
        samples = self._with_token_log_probs(samples)
        rows = PackedRows(samples)
        graphs = self._graphs_for_update()
        keys: list[str] = []
        sums: torch.Tensor | None = None
        updates = 0
        early_stopped = False
        for _ in range(s.update_epochs):
            # Every rank takes the same number of steps, an idle rank (no task this
            # iteration) with empty minibatches that contribute nothing.
            for part in rows.shuffled_parts(s.num_minibatches, self.generator):
                # A graph holds its step size: replayed once the warmup's is constant.
                if graphs is not None and self.optimizer_steps >= s.lr_warmup_updates:
                    stats = graphs.step(rows, part)
                else:
                    stats = self._minibatch_step(rows.select(part))
                if stats is None:
                    early_stopped = True
                    break
                updates += 1
                # Summed as one tensor, one add a step: the statistics of the steps on
                # rows of this rank's own that weigh something (`OWN_ROWS`), and their count.
                keys = keys or sorted(stats)
                packed = torch.stack([stats[key].float() for key in keys])
                packed = torch.where(stats[OWN_ROWS] > 0, packed, 0.0)
                sums = packed if sums is None else sums + packed
            if early_stopped:
                break
        totals = dict(zip(keys, sums.tolist(), strict=True)) if sums is not None else {}
        counted = totals.pop(OWN_ROWS, 0.0)  # none: this rank has no statistics to report
        metrics = {key: value / counted for key, value in totals.items()} if counted else {}
        metrics["losses/updates"] = float(updates)
        metrics["losses/early_stopped"] = float(early_stopped)
        if self.sharded:
            self._refresh_acting()
        log_std = getattr(self.acting_policy, "log_std", None)  # a Gaussian plan's
        if log_std is not None:
            metrics["policy/std"] = log_std.detach().exp().mean().item()
        return metrics

    @torch.no_grad()
    def _with_token_log_probs(self, samples: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`samples` with each token's log-prob under the policy as it is before the
        update's first step (the rollout's: the rollout stores only a chunk's sum) for
        the per-token ratio, and under the KL anchor's reference. One pass without
        gradients over the batch, in as many parts as minibatches: every rank makes the
        same calls (a sharded policy gathers its shards in each)."""
        s = self.settings
        if s.ratio != "token" and not s.kl_coef:
            return samples
        samples = dict(samples)
        parts = s.num_minibatches
        with self.autocast():
            if s.ratio == "token":
                samples[TOKEN_LOG_PROB] = recompute_token_log_probs(self.policy, samples, parts)
            if s.kl_coef:
                reference = self._reference_policy()
                samples[REFERENCE_LOG_PROB] = recompute_token_log_probs(reference, samples, parts)
        return samples

    def _reference_policy(self) -> nn.Module:
        """The KL anchor's reference: the policy as the first update finds it (`init_from`
        loaded), or as a checkpoint saved it."""
        if self.reference is None:
            self.reference = frozen_copy(self.acting_policy)
        return self.reference

    def _graphs_for_update(self) -> GraphedSteps | None:
        """The step graphs where this update's steps take one path whatever their data:
        one rank and no early stop (which asks the device, as a replay cannot)."""
        graphs = self.step_graphs
        if graphs is None or self.collective.world_size > 1 or self.sharded:
            return None
        return None if self.settings.target_kl is not None else graphs

    def _minibatch_step(self, mb: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
        """One gradient step; its statistics as tensors on the device, `OWN_ROWS` among
        them (1 where this rank's rows weigh something, else 0: its statistics say
        nothing). The policy-gradient terms (surrogate, entropy, KL, clip fractions)
        weigh each row by `policy_weight`, which leaves out the rows a human chose; the
        value loss takes every row of the batch (`weight`). None: stopped early
        (`target_kl`), no step taken."""
        s = self.settings
        weight, policy_weight = mb["weight"], mb["policy_weight"]
        total = weight.sum()
        with self.autocast():
            token_log_prob, token_entropy = self.policy.token_log_probs(
                *(mb[name] for name in CHUNK_INPUTS)
            )
        tokens = token_log_prob.shape[1] * token_log_prob.shape[2]
        chunk_log_ratio = token_log_prob.sum((1, 2)) - mb["log_prob"]
        clip, advantage = s.clip_range(), mb["advantage"]
        if s.ratio == "token":
            token_log_ratio = token_log_prob - mb[TOKEN_LOG_PROB]
            surrogate = clipped_surrogate(token_log_ratio, advantage, clip)
        elif s.ratio == "geometric_mean":
            surrogate = clipped_surrogate(chunk_log_ratio / tokens, advantage, clip, tokens)
        else:
            surrogate = clipped_surrogate(chunk_log_ratio, advantage, clip)
        with torch.no_grad():
            # Each policy row's statistics, and its count, summed by weight in one
            # product: on a GPU each op is a kernel of the step. The KL per chunk in
            # every mode; per token, and the tokens' mean |log-ratio|, where the
            # rollout's tokens are known (the per-token ratio).
            per_row = {
                "losses/approx_kl_chunk": k3(chunk_log_ratio),
                "losses/clip_fraction_low": surrogate.clipped_low,
                "losses/clip_fraction_high": surrogate.clipped_high,
            }
            if s.ratio == "token":
                per_row["losses/approx_kl_token"] = k3(token_log_ratio).mean((1, 2))
                per_row["losses/abs_log_ratio_token"] = token_log_ratio.abs().mean((1, 2))
                per_row.update(per_step_statistics(token_log_ratio, self.token_steps, clip))
            # Each action dim's token entropy, over the chunk's steps: which dims the
            # update sharpens and which it spreads over the bins.
            per_dim = token_entropy.detach().float().mean(1)
            for dim in range(per_dim.shape[1]):
                per_row[f"policy/entropy_dim{dim}"] = per_dim[:, dim]
            names = list(per_row)
            stacked = torch.stack([*per_row.values(), torch.ones_like(policy_weight)])
            mine = stacked @ policy_weight
            # Each row's share of this rank's policy-gradient mean, worked out once.
            share = policy_weight / mine[-1].clamp(min=1e-8)
            # The statistics and the early stop are for all ranks, over all their rows.
            summed = self.collective.sum_tensor(torch.cat([mine, total.detach().view(1)]))
            policy_rows, all_weight = summed[-2], summed[-1]
            means = dict(zip(names, summed[:-2] / policy_rows.clamp(min=1e-8), strict=True))
            # What target_kl reads: per token where each token is clipped, else per
            # chunk, whose ratio the other two modes bound.
            approx_kl = means.get("losses/approx_kl_token", means["losses/approx_kl_chunk"])
        if s.target_kl is not None and approx_kl > s.target_kl:
            return None
        policy_loss = surrogate.loss @ share
        entropy_mean = token_entropy.sum((1, 2)) @ share
        loss = policy_loss - s.entropy_coef * entropy_mean if s.entropy_coef else policy_loss
        stats = {
            "losses/policy_loss": policy_loss.detach(),
            "losses/entropy": entropy_mean.detach(),
            "losses/approx_kl": approx_kl,
            "losses/clip_fraction": means["losses/clip_fraction_low"]
            + means["losses/clip_fraction_high"],
            **means,
            OWN_ROWS: (total > 0).float(),
        }
        if s.kl_coef:
            # KL(policy || reference) per token from the policy's own tokens (k3 with
            # log r = log p_ref - log p), a token-mean over the policy's rows.
            kl_reference = k3(mb[REFERENCE_LOG_PROB] - token_log_prob).mean((1, 2)) @ share
            loss = loss + s.kl_coef * kl_reference
            stats["losses/kl_reference"] = kl_reference.detach()
        if self.critic is not None:
            value_loss = self._value_loss(mb, total)
            loss = loss + s.value_loss_coef * value_loss
            stats["losses/value_loss"] = value_loss.detach()
        self.optimizer.zero_grad()
        if self.collective.world_size > 1:
            # Each rank's gradient is the mean over its own rows; the update follows the
            # mean over every rank's rows, so each rank's loss counts by its share of all
            # the rows, and the ranks' scaled gradients are summed while backward runs
            # (by the buckets, or by FSDP's reduce-scatter). A rank without rows adds
            # nothing and shrinks nobody's step.
            loss = loss * (total.detach() / all_weight.clamp(min=1e-8))
        buckets = self._gradient_buckets()
        if buckets is not None:
            buckets.arm()
        loss.backward()
        if buckets is not None:
            buckets.finish()
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        nn.utils.clip_grad_norm_(params, s.max_grad_norm)
        # A minibatch that weighs nothing on every rank (masked groups only) takes no
        # step. The optimizer is told so on the device, as a GradScaler tells it of an
        # overflow, so that neither the host nor a replayed graph has to read it back
        # (the host's count of steps, for the step size's warmup, counts it all the same).
        self.optimizer.found_inf = (all_weight <= 0).float()
        self.step_optimizer()
        return stats

    def _gradient_buckets(self) -> GradientBuckets | None:
        """The hooks that sum gradients across ranks (None for one rank), made for the
        collective in use at the first step that has one; FSDP sums its own)."""
        if self.collective.world_size == 1 or self.sharded:
            return None
        if self._buckets is None or self._buckets.collective is not self.collective:
            if self._buckets is not None:
                self._buckets.remove()
            params = [p for group in self.optimizer.param_groups for p in group["params"]]
            self._buckets = GradientBuckets(params, self.collective, self.gradient_bucket_bytes)
        return self._buckets

    def _value_loss(self, mb: dict[str, torch.Tensor], total: torch.Tensor) -> torch.Tensor:
        """Half the weighted mean squared error of the values; `total`: the weights' sum."""
        assert self.critic is not None
        with self.autocast():
            values = self.critic(mb["obs"], mb["plan_horizon"], mb["chunk_offset"]).float()
        errors = (values - mb["returns"]) ** 2
        if self.settings.value_clip is not None:
            clipped = mb["value"] + (values - mb["value"]).clamp(
                -self.settings.value_clip, self.settings.value_clip
            )
            errors = torch.max(errors, (clipped - mb["returns"]) ** 2)
        return 0.5 * (errors @ mb["weight"]) / total.clamp(min=1e-8)

    # ----- checkpoints ---------------------------------------------------------
    def state_dict(self, shards: Path | None = None) -> dict[str, Any]:
        """The models' and the optimizer's state. Sharded (fsdp), every rank writes its
        own part of them into the folder `shards` and the state names it instead."""
        if self.sharded:
            import trainer.algorithms.sharding as sharding

            assert shards is not None, "sharded models save into a folder of shards"
            sharding.save_shards(self._models(), self.optimizer, shards)
            return {
                "shards": shards.name,
                "optimizer_steps": self.optimizer_steps,
                **self._reference_state(),
            }
        state: dict[str, Any] = {
            **policy_checkpoint(self.policy),
            "optimizer": self.optimizer.state_dict(),
            "optimizer_steps": self.optimizer_steps,
            **self._reference_state(),
        }
        if self.critic is not None:
            state["critic"] = self.critic.state_dict()
        return state

    def _reference_state(self) -> dict[str, Any]:
        """The KL anchor's reference, as far as it differs from the base (what trains in
        the policy, and the buffers), so that a resumed run anchors to where the run
        started, not to where it resumed; nothing without a reference."""
        if self.reference is None:
            return {}
        frozen = {n for n, p in self.acting_policy.named_parameters() if not p.requires_grad}
        state = self.reference.state_dict()
        return {"reference": {n: t for n, t in state.items() if n not in frozen}}

    def _load_reference(self, state: dict[str, Any]) -> None:
        if "reference" not in state or not self.settings.kl_coef:
            # None saved: the next update copies the policy as it is then. No anchor
            # (an evaluation, a run resumed without one): no copy to keep.
            return
        self.reference = frozen_copy(self.acting_policy)
        missing, unexpected = self.reference.load_state_dict(state["reference"], strict=False)
        frozen = {n for n, p in self.acting_policy.named_parameters() if not p.requires_grad}
        lacking = [name for name in missing if name not in frozen]
        if lacking or unexpected:
            raise RuntimeError(
                f"the saved reference policy does not fit this model: "
                f"{', '.join([*lacking, *unexpected][:5])}"
            )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A state from any number of ranks of either strategy: shards (`shards`, the
        folder's path as `load_checkpoint` resolved it) or full tensors."""
        self.policy_version += 1
        # Checkpoints from before the count resume as if their warmup were over.
        self.optimizer_steps = int(state.get("optimizer_steps", self.settings.lr_warmup_updates))
        self._load_reference(state)
        if "shards" in state or self.sharded:
            import trainer.algorithms.sharding as sharding

            if "shards" in state:
                sharding.load_shards(self._models(), self.optimizer, Path(state["shards"]))
            else:  # a ddp run's checkpoint, into sharded models
                for name, module in self._models().items():
                    sharding.load_full_state(module, state[name])
                params = [p for group in self.optimizer.param_groups for p in group["params"]]
                self.optimizer.load_state_dict(
                    sharding.shard_optimizer_state(self._saved_optimizer_state(state), params)
                )
            if self.sharded:
                self._refresh_acting()
            return
        load_policy_checkpoint(self.policy, state)
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])
        self.optimizer.load_state_dict(self._saved_optimizer_state(state))
        if self.step_graphs is not None:
            for group in self.optimizer.param_groups:
                # A saved group brings the flag of the run that saved it (a CPU run's is
                # False); this run's graphs need their own.
                group["capturable"] = self.step_graphs.capture
            self.step_graphs.reset()  # the graphs held the optimizer's old state

    def _saved_optimizer_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """The saved optimizer state, fitted to a critic that has gained its plan inputs
        since (a checkpoint from before them: the critic loads them at zero), and to the
        critic's own group (a checkpoint from before it held one group for both)."""
        if self.critic is None:
            return state["optimizer"]
        saved = state["optimizer"]
        if len(saved["param_groups"]) == 1:
            policy = len(self.optimizer.param_groups[0]["params"])
            saved = split_optimizer_group(saved, policy, self._base_learning_rates()[1])
        return optimizer_state_with_plan_inputs(self.critic, state["critic"], saved)

    def _models(self) -> nn.ModuleDict:
        """The policy and critic under one module: their checkpoint names."""
        models = nn.ModuleDict({"policy": self.policy})
        if self.critic is not None:
            models["critic"] = self.critic
        return models
