"""What RLPD's round and the on-policy minibatch step share to replay as CUDA graphs:
eager warm-up on a side stream, a capture whose statistics come out packed in one
tensor, and replays that copy them out before the next replay overwrites them."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

log = logging.getLogger(__name__)

T = TypeVar("T")
Stats = dict[str, torch.Tensor]


@dataclass
class PackedGraph:
    """A captured update and the one tensor its statistics are written into."""

    graph: torch.cuda.CUDAGraph
    keys: list[str]
    packed: torch.Tensor

    def replay(self) -> Stats:
        """Run the update again; its statistics, copied (the next replay rewrites them)."""
        self.graph.replay()
        return dict(zip(self.keys, self.packed.clone().unbind(0), strict=True))


def capture_stats(update: Callable[[], Stats], what: str, pool=None) -> PackedGraph | None:
    """`update` captured (`pool`: a memory pool shared with other captures), or None
    when it cannot be: the log says why, and eager updates compute the same, slower.
    Capturing runs the update's Python but none of its kernels."""
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, pool=pool):
            stats = update()
            keys = sorted(stats)
            packed = torch.stack([stats[key].float() for key in keys])
    except RuntimeError as error:
        log.warning("%s could not be captured as a CUDA graph (%s); it runs kernel by "
                    "kernel", what, error)  # fmt: skip
        return None
    return PackedGraph(graph, keys, packed)


def on_side_stream(stream: torch.cuda.Stream, run: Callable[[], T]) -> T:
    """`run` on `stream`, ordered after and before the current stream's work: where the
    warm-up before a capture must run (cuBLAS and the fused optimisers set up there)."""
    main = torch.cuda.current_stream(stream.device)
    stream.wait_stream(main)
    with torch.cuda.stream(stream):
        result = run()
    main.wait_stream(stream)
    return result
