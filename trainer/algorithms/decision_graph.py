"""A rollout's decisions on a GPU, each phase of the plan cache's schedule captured once
as a CUDA graph and replayed.

A decision of a small policy (the slots that replan: their observations, the policy's
forward, the sampled plans and their log-probs, the plans kept in the cache and every
slot's chunk taken out) is ~25 small kernels. Launched one by one from Python, their
launches cost more than the envs' step leaves the GPU to do: the rollout loop's time
went to launching. Replayed from a graph, a decision is one launch.

A graph has fixed shapes and fixed indices, and a decision's are those of its phase
(`PlanCache`: which slots replan, how far their plans go, where each slot's chunk
starts), the same at every decision of that phase in every round of the cache. So each
(cache, phase) is captured once, at its second decision (its first, eager, works out
the phase and makes the cache's tables), after the first few decisions of the run have
run eagerly on a side stream, as CUDA graphs ask. The observations are copied into the
graph's input; its actions and log-probs are copied out, since the next replay writes
over them while the round's storage still holds this decision's. A replay draws its own
noise (the generator's offset advances with each replay), and leaves the Python of the
decision unrun, so the cache's walk is advanced here (`PlanCache.advance`).

Without `capture` (the CPU) the same fixed input and copies serve eager decisions: the
CPU suite runs the path a GPU's replays use, less the replay itself.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass

import torch
from torch import nn

from trainer.algorithms.cuda_graphs import on_side_stream
from trainer.models.plan_cache import ChunkDraw, PlanCache, decide
from trainer.models.policy import GaussianChunkPolicy

log = logging.getLogger(__name__)

WARMUP_DECISIONS = 3
MAX_GRAPHS = 32  # phases captured per run; decisions of any further phase run eagerly


def graphable(policy: nn.Module, device: torch.device) -> bool:
    """Whether `policy`'s steps can be captured on `device`: the built-in policies on a
    GPU. A transformers model's forward (the VLA's) reads data back to choose its path,
    which a capture cannot hold."""
    return device.type == "cuda" and isinstance(policy, GaussianChunkPolicy)


@dataclass
class _Decision:
    """One phase's fixed input and, once captured, its graph and outputs."""

    policy: nn.Module
    obs: torch.Tensor
    graph: torch.cuda.CUDAGraph | None = None
    draw: ChunkDraw | None = None


class GraphedDecisions:
    """The decisions of `trainer.models.plan_cache.decide`, eager at first, then each
    phase of each plan cache captured once and replayed (`capture`), or made eagerly on
    the same fixed input (the CPU)."""

    def __init__(self, device: torch.device, capture: bool = True) -> None:
        self.capture = capture
        self.side_stream = torch.cuda.Stream(device) if capture else None
        self.failed = False  # a capture failed: every decision runs eagerly from then on
        # A cache's phases live as long as the cache does (a run makes a new one when
        # its horizons change).
        self.phases: weakref.WeakKeyDictionary[PlanCache, dict[int, _Decision]] = (
            weakref.WeakKeyDictionary()
        )
        self.pool = None  # one memory pool for every graph: replays never overlap
        self.graphs = 0
        self.eager_decisions = 0

    def decide(
        self, policy: nn.Module, cache: PlanCache, obs: torch.Tensor, chunk: int
    ) -> ChunkDraw:
        """The decision `decide(policy, cache, obs, chunk)` makes, by replay where its
        phase has a graph."""
        phases = self.phases.setdefault(cache, {})
        phase = cache.phase_key()
        entry = phases.get(phase)
        if entry is None or entry.policy is not policy:
            # The phase's first decision works out the phase and makes the cache's
            # tables (or another model acts, e.g. the full copy of a sharded run's).
            phases[phase] = _Decision(policy, torch.empty_like(obs))
            return self._eager(policy, cache, obs, chunk)
        if self.capture and entry.graph is None:
            if not self._may_capture() or not self._capture(entry, cache, chunk):
                return self._eager(policy, cache, obs, chunk)
        entry.obs.copy_(obs)
        if entry.graph is None:  # the CPU: the decision itself, on the fixed input
            draw = decide(policy, cache, entry.obs, chunk)
        else:
            entry.graph.replay()
            cache.advance()
            assert entry.draw is not None
            draw = entry.draw
        # Copied out: the next replay of this phase writes over its outputs.
        return ChunkDraw(
            draw.actions.clone(), draw.log_prob.clone(), draw.offsets, draw.horizons,
            draw.plan_latent,
        )  # fmt: skip

    def _eager(
        self, policy: nn.Module, cache: PlanCache, obs: torch.Tensor, chunk: int
    ) -> ChunkDraw:
        if self.side_stream is None or self.failed or self.graphs >= MAX_GRAPHS:
            return decide(policy, cache, obs, chunk)
        # Captures are still to come: eager decisions warm up on the side stream.
        self.eager_decisions += 1
        return on_side_stream(self.side_stream, lambda: decide(policy, cache, obs, chunk))

    def _may_capture(self) -> bool:
        return (
            not self.failed
            and self.eager_decisions >= WARMUP_DECISIONS
            and self.graphs < MAX_GRAPHS
        )

    def _capture(self, entry: _Decision, cache: PlanCache, chunk: int) -> bool:
        """Record the phase's decision; whether it could be (the log says why not)."""
        graph = torch.cuda.CUDAGraph()
        walked = cache.position()  # capturing runs the Python, not the kernels
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                entry.draw = decide(entry.policy, cache, entry.obs, chunk)
        except RuntimeError as error:
            log.warning("a rollout decision could not be captured as a CUDA graph (%s); "
                        "decisions run kernel by kernel", error)  # fmt: skip
            self.failed = True
            entry.draw = None
            return False
        finally:
            cache.go_to(walked)
        entry.graph = graph
        self.pool = graph.pool()
        self.graphs += 1
        return True
