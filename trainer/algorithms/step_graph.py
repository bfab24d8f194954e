"""The on-policy update's minibatch step on a GPU, captured as a CUDA graph and replayed.

A PPO minibatch step of a small network (forward of the policy and critic, losses,
backward, gradient clip, Adam) is ~200 small kernels. Launched one by one from Python
the GPU waits on the launches: at Isaac Lab scale, ours and a minimal-torch update both
kept an H100 busy under a fifth of the update's time. Replayed from a graph, a step is
one launch.

A graph has fixed shapes, and a minibatch's row count follows the round's valid rows.
So each minibatch is gathered into fixed tables of a padded size (a size ladder with
eight steps per doubling: at most 1/8 more rows), its padding copies of its first row
that weigh nothing: every term of the step is a weighted mean, so the padded step
computes what the plain one does. A run whose row counts wander captures a few sizes,
all sharing one memory pool (replays never overlap, and each replay's statistics are
copied before the next).

The first steps run eagerly on a side stream, as CUDA graphs ask: the fused Adam and
cuBLAS set themselves up there before anything is captured. Replays leave the Python of
the step unrun, so what it counts (the optimizer's steps) is counted here.

Without `capture` (the CPU) the same fixed tables feed the step eagerly: the CPU suite
runs the padding and gathering a GPU's replays use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from trainer.algorithms.cuda_graphs import PackedGraph, capture_stats, on_side_stream
from trainer.data.rollout_storage import Layout, PackedRows

WARMUP_STEPS = 3
MAX_GRAPHS = 8  # sizes captured per run; steps of any further size run eagerly
# The columns whose zero makes a padding row weigh nothing in every term of the step.
WEIGHTS = ("weight", "policy_weight")


def padded_rows(rows: int) -> int:
    """`rows` rounded up to the size ladder: multiples of an eighth of the power of two
    below it, so at most 1/8 of a padded minibatch is padding."""
    granule = 1 << max(0, rows.bit_length() - 4)
    return -(-rows // granule) * granule


class SteppedAlgorithm(Protocol):
    """What the graphed steps need of the algorithm whose minibatch steps they run
    (OnPolicyAlgorithm's): its device, the step, and its count of optimizer steps, which
    a replay advances without running the step's Python. Described here rather than
    imported, so that the algorithm's module, which builds `GraphedSteps`, is the only
    one of the two to import the other."""

    device: torch.device
    optimizer_steps: int

    def _minibatch_step(
        self, minibatch: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor] | None: ...


@dataclass
class _Step:
    """A step's fixed input tables, and its graph (none where nothing is captured)."""

    tables: dict[torch.dtype, torch.Tensor]
    inputs: dict[str, torch.Tensor]
    graph: PackedGraph | None = None


class GraphedSteps:
    """An algorithm's minibatch steps: eager at first, then each padded size captured
    once and replayed (`capture`), or run eagerly on the same tables (the CPU)."""

    def __init__(self, algorithm: SteppedAlgorithm, capture: bool = True) -> None:
        self.algorithm = algorithm
        self.capture = capture
        self.side_stream = torch.cuda.Stream(algorithm.device) if capture else None
        self.failed = False  # a capture failed: every step runs eagerly from then on
        self.reset()

    def reset(self) -> None:
        """Forget the captured steps, after the optimizer's state was replaced (a
        checkpoint loaded): the graphs read and write its old tensors."""
        self.steps: dict[tuple[int, Layout], _Step] = {}
        self.pool = None
        self.eager_steps = 0

    def step(self, rows: PackedRows, part: torch.Tensor) -> dict[str, torch.Tensor]:
        """The minibatch step on the rows `part` of `rows`, its statistics on the device."""
        count = part.numel()
        key = (padded_rows(count), rows.layout)
        step = self.steps.get(key)
        if step is None:
            if (
                count == 0
                or self.failed
                or self.eager_steps < WARMUP_STEPS
                or len(self.steps) >= MAX_GRAPHS
            ):
                self.eager_steps += 1
                return self._eager(rows.select(part))
            step = self._build(rows, key[0])
            if step is None:
                return self._eager(rows.select(part))
            self.steps[key] = step
        self._fill(step, rows, part)
        if step.graph is None:  # not captured: the step itself, on the fixed tables
            return self.algorithm._minibatch_step(step.inputs)
        stats = step.graph.replay()
        self.algorithm.optimizer_steps += 1
        return stats

    def _fill(self, step: _Step, rows: PackedRows, part: torch.Tensor) -> None:
        size, count = next(iter(step.tables.values())).shape[0], part.numel()
        index = part if count == size else torch.cat([part, part[:1].expand(size - count)])
        rows.select_into(index, step.tables)
        if count < size:
            for name in WEIGHTS:
                step.inputs[name][count:].zero_()

    def _eager(self, minibatch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.side_stream is None:
            return self.algorithm._minibatch_step(minibatch)
        return on_side_stream(self.side_stream, lambda: self.algorithm._minibatch_step(minibatch))

    def _build(self, rows: PackedRows, size: int) -> _Step | None:
        tables = rows.empty(size)
        inputs = rows.views(tables)
        if not self.capture:
            return _Step(tables, inputs)
        # What the tables hold does not matter yet: a capture records kernels, runs none.
        algorithm = self.algorithm
        steps_taken = algorithm.optimizer_steps  # capturing runs the Python, not the kernels
        try:
            graph = capture_stats(
                lambda: algorithm._minibatch_step(inputs), "the update's minibatch step",
                self.pool,
            )  # fmt: skip
        finally:
            algorithm.optimizer_steps = steps_taken
        if graph is None:
            self.failed = True
            return None
        self.pool = graph.graph.pool()
        return _Step(tables, inputs, graph)
