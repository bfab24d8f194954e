"""The shared rollout side and clipped policy-gradient update of PPO, GRPO and RLOO.

The shape follows rsl_rl: ``act`` chooses actions and starts a transition,
``process_env_step`` completes and stores it, ``compute_returns`` turns a batch of
trajectories into advantages, ``update`` runs minibatch epochs. Subclasses differ only
in ``compute_returns`` (and PPO in having a critic).
"""

from __future__ import annotations

import contextlib
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
from trainer.data.rollout_storage import (
    PER_COPY,
    PackedRows,
    RolloutStorage,
    Trajectories,
    Transition,
)
from trainer.devices import HostToDevice, autocast, to_device_async
from trainer.envs.vector_env import EnvStep
from trainer.models.plan_cache import ChunkDraw, PlanCache, decide
from trainer.models.policy import GaussianChunkPolicy
from trainer.models.trained_state import load_policy_checkpoint, policy_checkpoint


@dataclass
class OnPolicySettings:
    """Hyperparameters of the update; see ``trainer.config`` for what each means."""

    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_ratio: float = 0.2
    value_clip: float | None = None
    value_loss_coef: float = 0.5
    entropy_coef: float = 0.0
    target_kl: float | None = None
    update_epochs: int = 4
    num_minibatches: int = 4
    learning_rate: float = 3e-4
    max_grad_norm: float = 1.0
    # None: the algorithm's own default (PPO normalises its GAE advantages; GRPO and
    # RLOO do not, theirs are already relative to their group).
    normalize_advantages: bool | None = None
    group_size: int = 1
    use_plan_reward: bool = False
    plan_reward_coef: float = 0.0
    base_h: float = 5.0
    bootstrap_timeouts: bool = True
    # "chunk": the probability ratio of a whole chunk (the product of its actions' and
    # dims' ratios); "geometric_mean": that ratio's geometric mean over the chunk's
    # actions x dims (length-normalised, as GSPO does for sequences), which a policy of
    # many action tokens needs for its clip to mean anything.
    ratio: str = "chunk"
    # GRPO/RLOO: "rows" (each decision weighs the same) or "episodes" (each episode
    # weighs the same, its decisions sharing that weight).
    loss_aggregation: str = "rows"
    lr_warmup_updates: int = 0
    # On a GPU, replay each minibatch step from a captured CUDA graph (step_graph.py).
    cuda_graph: bool = True
    # On a GPU, replay each rollout decision from a captured CUDA graph (decision_graph.py).
    rollout_cuda_graph: bool = True


# The statistic that says whether a step's own rows weighed anything (see _minibatch_step).
OWN_ROWS = "own_rows"
_CRITIC_BATCH_ELEMENTS = 2**24  # observation floats per critic call when valuing a round


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
        # A CPU generator on every device: shuffles and seeds are the same draws on a
        # GPU as on the CPU, and only indices cross to the device.
        self.generator = generator
        self.to_device = HostToDevice(self.device)
        can_graph = graphable(policy, self.device)
        graphed = settings.cuda_graph and can_graph
        self.step_graphs: GraphedSteps | None = GraphedSteps(self) if graphed else None
        self.decision_graphs: GraphedDecisions | None = (
            GraphedDecisions(self.device) if settings.rollout_cuda_graph and can_graph else None
        )
        self.optimizer = self._make_optimizer()
        self.optimizer_steps = 0  # taken so far, for the step size's warmup
        # The other actor ranks this one trains with (none by default); the runner
        # sets it. Gradients, advantage statistics and early stops are agreed through it.
        self.collective = Collective()
        self.plan_cache: PlanCache | None = None
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
        params = [p for p in self.policy.parameters() if p.requires_grad]
        params += list(self.critic.parameters()) if self.critic is not None else []
        # Fused on every device: one kernel per step (on the CPU a quarter of the
        # multi-tensor loop's time), and the only Adam that can be told on the device to
        # skip a step (`found_inf`, see _minibatch_step); capturable (its step count on
        # the device) where a graph replays it.
        return torch.optim.Adam(
            params, lr=self.settings.learning_rate, fused=True,
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
            for group in self.optimizer.param_groups:
                group["lr"] = self.settings.learning_rate * scale
        self.optimizer.step()

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
        the same horizons (every round of a run) share the plan cache's schedule."""
        cache, max_horizon = self.plan_cache, self.acting_policy.max_horizon
        if cache is not None and cache.same_schedule(horizons, self.chunk, max_horizon):
            cache.restart()
        else:
            self.plan_cache = PlanCache(horizons, self.chunk, max_horizon, self.device)
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
            )  # fmt: skip
            if bootstrapped is not reward:
                reward.copy_(bootstrapped)
        self.storage.add(Transition(obs, draw.actions, draw.offsets, draw.log_prob, per_copy))
        self._pending = None

    def _values(self, obs: torch.Tensor) -> torch.Tensor:
        """The critic's values of observations on the device (the time-out bootstrap's)."""
        assert self.acting_critic is not None
        with self.autocast():
            return self.acting_critic(obs).float()

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
        """``V(obs)`` of every valid row, batched (one call for a round of state
        vectors); 0 elsewhere, and everywhere for algorithms without a critic."""
        critic = self.acting_critic
        if critic is None:
            return trajectories
        obs = trajectories.obs
        # Row indices into the flattened [T * B] rows: selecting and writing rows by
        # index is several times faster on the CPU than boolean-mask indexing.
        rows = trajectories.valid.view(-1).nonzero().squeeze(1)  # never empty
        valid_obs = obs.view(-1, *obs.shape[2:]).index_select(0, rows)
        # Bounded batches: a round of camera images is large, its activations larger.
        batch = max(1, _CRITIC_BATCH_ELEMENTS // obs.shape[2:].numel())
        with self.autocast():
            if len(rows) <= batch:
                values = critic(valid_obs)
            else:
                values = torch.cat([critic(part) for part in valid_obs.split(batch)])
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
        the update stops as soon as a minibatch's approximate KL exceeds it, before
        that minibatch's gradient step. Statistics stay on the device until the end:
        the update reads them back once.
        """
        s = self.settings
        self.policy_version += 1
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
        nothing). The policy-gradient terms (surrogate, entropy, KL, clip fraction) weigh
        each row by `policy_weight`, which leaves out the rows a human chose; the value
        loss takes every row of the batch (`weight`). None: stopped early (`target_kl`),
        no step taken."""
        s = self.settings
        weight, policy_weight = mb["weight"], mb["policy_weight"]
        total = weight.sum()
        with self.autocast():
            log_prob, entropy = self.policy.chunk_log_prob(
                mb["plan_obs"], mb["plan_horizon"], mb["chunk_offset"], mb["actions"]
            )
        log_ratio = log_prob - mb["log_prob"]
        if s.ratio == "geometric_mean":
            log_ratio = log_ratio / (mb["actions"].shape[1] * self.policy.env_action_dim)
        ratio = log_ratio.exp()
        with torch.no_grad():
            # Each policy row's KL estimate, whether it clips, and its count, summed by
            # weight in one product: on a GPU each op is a kernel of the step.
            excess = ratio - 1
            per_row = torch.stack(
                [excess - log_ratio, (excess.abs() > s.clip_ratio).float(), torch.ones_like(excess)]
            )
            mine = per_row @ policy_weight
            # Each row's share of this rank's policy-gradient mean, worked out once.
            share = policy_weight / mine[2].clamp(min=1e-8)
            # The early stop is one decision for all ranks, on the KL over all rows.
            kl_sum, clipped_sum, policy_rows, all_weight = self.collective.sum_tensor(
                torch.cat([mine, total.detach().view(1)])
            )
            approx_kl = kl_sum / policy_rows.clamp(min=1e-8)
        if s.target_kl is not None and approx_kl > s.target_kl:
            return None
        against = -mb["advantage"]
        surrogate = torch.max(
            against * ratio, against * ratio.clamp(1 - s.clip_ratio, 1 + s.clip_ratio)
        )
        policy_loss = surrogate @ share
        entropy_mean = entropy @ share
        loss = policy_loss - s.entropy_coef * entropy_mean if s.entropy_coef else policy_loss
        stats = {
            "losses/policy_loss": policy_loss.detach(),
            "losses/entropy": entropy_mean.detach(),
            "losses/approx_kl": approx_kl,
            "losses/clip_fraction": clipped_sum / policy_rows.clamp(min=1e-8),
            OWN_ROWS: (total > 0).float(),
        }
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
            values = self.critic(mb["obs"]).float()
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
            return {"shards": shards.name, "optimizer_steps": self.optimizer_steps}
        state: dict[str, Any] = {
            **policy_checkpoint(self.policy),
            "optimizer": self.optimizer.state_dict(),
            "optimizer_steps": self.optimizer_steps,
        }
        if self.critic is not None:
            state["critic"] = self.critic.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A state from any number of ranks of either strategy: shards (`shards`, the
        folder's path as `load_checkpoint` resolved it) or full tensors."""
        self.policy_version += 1
        # Checkpoints from before the count resume as if their warmup were over.
        self.optimizer_steps = int(state.get("optimizer_steps", self.settings.lr_warmup_updates))
        if "shards" in state or self.sharded:
            import trainer.algorithms.sharding as sharding

            if "shards" in state:
                sharding.load_shards(self._models(), self.optimizer, Path(state["shards"]))
            else:  # a ddp run's checkpoint, into sharded models
                for name, module in self._models().items():
                    sharding.load_full_state(module, state[name])
                params = [p for group in self.optimizer.param_groups for p in group["params"]]
                self.optimizer.load_state_dict(
                    sharding.shard_optimizer_state(state["optimizer"], params)
                )
            if self.sharded:
                self._refresh_acting()
            return
        load_policy_checkpoint(self.policy, state)
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.step_graphs is not None:
            for group in self.optimizer.param_groups:
                # A saved group brings the flag of the run that saved it (a CPU run's is
                # False); this run's graphs need their own.
                group["capturable"] = self.step_graphs.capture
            self.step_graphs.reset()  # the graphs held the optimizer's old state

    def _models(self) -> nn.ModuleDict:
        """The policy and critic under one module: their checkpoint names."""
        models = nn.ModuleDict({"policy": self.policy})
        if self.critic is not None:
            models["critic"] = self.critic
        return models
