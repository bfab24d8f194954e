"""Rollout workers: the `rollout` processes of a run's placement, one per actor rank,
each making that rank's decisions (policy inference with the plan cache) in its own
placed process, e.g. a policy on a GPU node while the rank trains elsewhere.

Each round the rank sends its worker the round's horizons, a seed drawn from its own
generator (so a resumed run draws the same actions) and, when the policy changed since
the last round, its weights; then every decision's observations go out and the chunk
comes back (actions, their log-probabilities, offsets). The rank stores and trains on
them exactly as on its own decisions (trainer.models.plan_cache.decide runs on
both sides). A worker that dies or does not answer within `reply_timeout_s` fails the
round naming it (rank, node, pid).
"""

from __future__ import annotations

from typing import Any

import ray
import torch
from torch import nn

from trainer.algorithms.decision_graph import GraphedDecisions, graphable
from trainer.config.env_shards import ROLLOUT
from trainer.config.schema import ExperimentConfig
from trainer.devices import to_device_async
from trainer.models.plan_cache import ChunkDraw, PlanCache, SpareCaches, decide
from trainer.models.trained_state import load_trained_state, trained_state
from trainer.runtime.ray_calls import answer
from trainer.whereabouts import ProcessReport

REPLY_TIMEOUT_S = 600.0


class RolloutWorkerError(RuntimeError):
    """The rank's rollout worker died or did not answer in time."""


class RolloutWorker:
    """A rank's decisions in their own placed process."""

    def __init__(self, config: dict[str, Any], rank: int, node_rank: int) -> None:
        self.config = ExperimentConfig.model_validate(config)
        self.rank, self.node_rank = rank, node_rank
        if self.config.runner.torch_threads:
            torch.set_num_threads(self.config.runner.torch_threads)
        self.policy: nn.Module | None = None
        self.cache: PlanCache | None = None
        self.spare_caches = SpareCaches()
        self.device = torch.device("cpu")  # prepare() resolves actor.device
        self.graphs: GraphedDecisions | None = None  # on a GPU: decisions replayed

    def prepare(
        self,
        obs_shape: tuple[int, ...],
        env_action_dim: int,
        vision_language: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Build the policy for the rank's env (its `VisionLanguageSpec`, as JSON, for a
        VLA), on this process's `actor.device`; where this process is, for the run page."""
        from trainer.devices import describe_device
        from trainer.envs.vision_language import VisionLanguageSpec
        from trainer.runner.build import build_policy, compute_device

        self.device = compute_device(self.config)
        spec = VisionLanguageSpec.from_json(vision_language) if vision_language else None
        self.policy = build_policy(self.config, tuple(obs_shape), env_action_dim, spec)
        self.policy.to(self.device).eval()
        if graphable(self.policy, self.device) and self.config.rollout.cuda_graph:
            self.graphs = GraphedDecisions(self.device)
        node_ip = ray.util.get_node_ip_address()
        device = describe_device(self.device)
        return ProcessReport.here(ROLLOUT, self.rank, self.node_rank, node_ip, device).to_json()

    def start_round(
        self, horizons: torch.Tensor, weights: dict[str, torch.Tensor] | None, seed: int
    ) -> None:
        assert self.policy is not None, "prepare() first"
        if weights is not None:
            load_trained_state(self.policy, weights)
        chunk = self.config.actor.model.num_action_chunks
        self.cache = self.spare_caches.cache_for_round(
            self.cache, horizons, chunk, self.policy.max_horizon, self.device
        )
        torch.manual_seed(seed)

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> ChunkDraw:
        assert self.policy is not None and self.cache is not None, "start_round() first"
        chunk = self.config.actor.model.num_action_chunks
        deciding = decide if self.graphs is None else self.graphs.decide
        # On the CPU both ways: the rank may compute elsewhere, or on no GPU.
        draw = deciding(self.policy, self.cache, to_device_async(obs, self.device), chunk)
        return draw.to(torch.device("cpu"))

    def device_metrics(self) -> dict[str, float]:
        from trainer.devices import device_metrics

        return device_metrics(self.device)


class RemoteDecider:
    """The rank's side: its decisions made by its placed rollout worker."""

    def __init__(
        self, handle: Any, report: ProcessReport, reply_timeout_s: float = REPLY_TIMEOUT_S
    ) -> None:
        self.handle, self.report, self.reply_timeout_s = handle, report, reply_timeout_s
        self.sent_version: int | None = None

    def start_round(
        self, horizons: torch.Tensor, policy: nn.Module, version: int, seed: int
    ) -> None:
        weights = None
        if version != self.sent_version:
            weights = {name: t.detach().cpu() for name, t in trained_state(policy).items()}
            self.sent_version = version
        self._answer(self.handle.start_round.remote(horizons, weights, seed), "starting a round")

    def act(self, obs: torch.Tensor) -> ChunkDraw:
        return self._answer(self.handle.act.remote(obs.cpu()), "deciding")

    def device_metrics(self) -> dict[str, float]:
        return self._answer(self.handle.device_metrics.remote(), "reporting its device")

    def _answer(self, ref: Any, doing: str) -> Any:
        where = (
            f"rollout worker {self.report.rank} (node {self.report.node_rank}, "
            f"pid {self.report.pid})"
        )
        return answer(
            ref, who=where, doing=doing, error=RolloutWorkerError,
            timeout_s=self.reply_timeout_s,
        )  # fmt: skip
