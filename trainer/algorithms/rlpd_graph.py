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

import logging
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from trainer.algorithms.rlpd import RLPDLearner

log = logging.getLogger(__name__)

Batch = dict[str, torch.Tensor]
# What a round reads of a batch.
INPUTS = ("obs", "action", "reward", "next_obs", "terminal")
WARMUP_ROUNDS = 3


class GraphedRound:
    def __init__(self, learner: RLPDLearner) -> None:
        self.learner = learner
        self.device = learner.device
        self.side_stream = torch.cuda.Stream(self.device)
        self.reset()
        self.failed = False  # a capture failed: every round runs eagerly from then on

    def reset(self) -> None:
        """Forget the captured round, after the learner's state was replaced."""
        self.graph: torch.cuda.CUDAGraph | None = None
        self.inputs: list[Batch] = []
        self.keys: list[str] = []
        self.packed: torch.Tensor | None = None
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
        self.graph.replay()
        self.learner.updates += len(batches)
        return dict(zip(self.keys, self.packed.clone().unbind(0), strict=True))

    def _eager(self, batches: list[Batch]) -> dict[str, torch.Tensor]:
        main = torch.cuda.current_stream(self.device)
        self.side_stream.wait_stream(main)
        with torch.cuda.stream(self.side_stream):
            metrics = self.learner.round(batches)
        main.wait_stream(self.side_stream)
        return metrics

    def _capture(self, batches: list[Batch]) -> None:
        inputs = [{name: batch[name].clone() for name in INPUTS} for batch in batches]
        updates = self.learner.updates  # capturing runs the Python, not the kernels
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize(self.device)
        try:
            with torch.cuda.graph(graph):
                metrics = self.learner.round(inputs)
                keys = sorted(metrics)
                packed = torch.stack([metrics[key].float() for key in keys])
        except RuntimeError as error:
            # Eager rounds compute the same thing, only slower: say so and go on.
            log.warning("rlpd: the update round could not be captured as a CUDA graph "
                        "(%s); rounds run kernel by kernel", error)  # fmt: skip
            self.failed = True
            return
        finally:
            self.learner.updates = updates
        self.graph, self.inputs, self.keys, self.packed = graph, inputs, keys, packed
