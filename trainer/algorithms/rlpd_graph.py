"""RLPD's update round on a GPU, captured once as a CUDA graph and replayed.

A round on the defaults (ten critics, cta_ratio 2) is ~300 small kernels. Launched one
by one from Python the GPU sits idle between them: under the profiler it was busy 65 ms
of 863 for 50 rounds. Replayed from a graph, a round is one launch.

The batches are drawn outside the graph (the sampler's generator draws where the
buffers grow between rounds) and copied into the graph's fixed inputs. The round's
statistics come out packed in one tensor, copied once a round so that the next replay
does not overwrite what the iteration has not read yet. The first rounds run eagerly
on a side stream, as CUDA graphs ask: the fused optimisers and cuBLAS set themselves up
there before anything is captured.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import torch

from trainer.algorithms.cuda_graphs import PackedGraph, capture_stats, on_side_stream

Batch = dict[str, torch.Tensor]
WARMUP_ROUNDS = 3


class RoundLearner(Protocol):
    """What a graphed round needs of a learner (trainer.algorithms.rlpd's): described
    here rather than imported, so that the learner's module, which builds a
    `GraphedRound`, is the only one of the two to import the other."""

    device: torch.device
    fields: tuple[str, ...]  # the batch fields a round reads
    updates: int  # critic updates so far, one per batch of a round

    def round(self, batches: Iterable[Batch]) -> dict[str, torch.Tensor]: ...


class GraphedRound:
    def __init__(self, learner: RoundLearner) -> None:
        self.learner = learner
        self.device = learner.device
        self.side_stream = torch.cuda.Stream(self.device)
        self.reset()
        self.failed = False  # a capture failed: every round runs eagerly from then on

    def reset(self) -> None:
        """Forget the captured round, after the learner's state was replaced."""
        self.graph: PackedGraph | None = None
        self.inputs: list[Batch] = []
        self.eager_rounds = 0

    def update(self, batches: list[Batch]) -> dict[str, torch.Tensor]:
        if self.graph is None:
            if self.failed or self.eager_rounds < WARMUP_ROUNDS:
                self.eager_rounds += 1
                return self._eager(batches)
            self._capture(batches)
            if self.graph is None:
                return self._eager(batches)
        for fixed, batch in zip(self.inputs, batches, strict=True):
            for name, tensor in fixed.items():
                tensor.copy_(batch[name])
        metrics = self.graph.replay()
        self.learner.updates += len(batches)
        return metrics

    def _eager(self, batches: list[Batch]) -> dict[str, torch.Tensor]:
        return on_side_stream(self.side_stream, lambda: self.learner.round(batches))

    def _capture(self, batches: list[Batch]) -> None:
        fields = self.learner.fields
        inputs = [{name: batch[name].clone() for name in fields} for batch in batches]
        updates = self.learner.updates  # capturing runs the Python, not the kernels
        try:
            graph = capture_stats(lambda: self.learner.round(inputs), "rlpd's update round")
        finally:
            self.learner.updates = updates
        self.failed = graph is None
        if graph is not None:
            self.graph, self.inputs = graph, inputs
