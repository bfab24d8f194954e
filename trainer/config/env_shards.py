"""Which env workers of a placement plan step which actor rank's env copies, and how a
batch of copies splits into shards (no Ray and no torch here: config validation and
the single-process path use it without importing either)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trainer.cluster import ProcessPlacement
from trainer.config.errors import ConfigError

ACTOR = "actor"
ENV = "env"
ROLLOUT = "rollout"  # trainer.runtime.rollout_workers: one per actor rank


def shard_sizes(num_envs: int, num_shards: int) -> list[int]:
    """Copies per shard: as even as possible, the first shards one larger."""
    if not 1 <= num_shards <= num_envs:
        raise ValueError(f"the shard count must be in 1..num_envs ({num_envs}), not {num_shards}")
    base, extra = divmod(num_envs, num_shards)
    return [base + (1 if shard < extra else 0) for shard in range(num_shards)]


@dataclass(frozen=True)
class EnvShard:
    """One env worker of a rank: where it runs, how many copies it steps, the first of
    them among the rank's copies and among the run's (the console numbers robots across
    the run)."""

    process: ProcessPlacement
    num_envs: int
    first_copy: int = 0
    run_first_copy: int = 0


def assign_env_shards(
    env_processes: Sequence[ProcessPlacement], world_size: int, copies_per_rank: int
) -> list[list[EnvShard]]:
    """The plan's env processes over the actor ranks in process-rank order, in contiguous
    blocks (rank 0 the first ones); each rank's copies split evenly over its block."""
    if not env_processes:
        return [[] for _ in range(world_size)]
    where = "cluster.component_placement.env"
    if len(env_processes) < world_size:
        raise ConfigError.single(
            where,
            f"{len(env_processes)} env process(es) for {world_size} actor ranks: each rank "
            "needs at least one env worker",
            rule="placement.env_workers",
        )
    blocks = shard_sizes(len(env_processes), world_size)
    if max(blocks) > copies_per_rank:
        raise ConfigError.single(
            where,
            f"{max(blocks)} env workers for one rank's {copies_per_rank} env copies "
            "(env.num_parallel_envs x algorithm.group_size): a worker would have none",
            rule="placement.env_workers",
        )
    ordered = sorted(env_processes, key=lambda p: p.process_rank)
    shards, start = [], 0
    for rank, size in enumerate(blocks):
        block = ordered[start : start + size]
        start += size
        sizes = shard_sizes(copies_per_rank, len(block))
        firsts = [sum(sizes[:index]) for index in range(len(sizes))]
        shards.append(
            [
                EnvShard(p, n, first, rank * copies_per_rank + first)
                for p, n, first in zip(block, sizes, firsts, strict=True)
            ]
        )
    return shards
