"""Collecting exactly ``data_batch_size`` trajectories per iteration (seed 001), with
the optional group filter of GRPO/RLOO and its bounded resampling."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from trainer.algorithms.group_filter import informative_groups
from trainer.algorithms.on_policy import OnPolicyAlgorithm, RolloutState
from trainer.data.rollout_storage import Trajectories, concat_trajectories
from trainer.envs.vector_env import VectorEnv
from trainer.videos.capture import RoundCapture

log = logging.getLogger(__name__)


def run_round(
    env: VectorEnv,
    algorithm: OnPolicyAlgorithm,
    task_id: int,
    init_state_indices: list[int],
    horizons: torch.Tensor,
    num_steps: int,
    first_group_index: int = 0,
    group_size: int = 1,
    stages: int = 1,
    capture: RoundCapture | None = None,
) -> Trajectories:
    """Every env slot runs one episode of ``task_id`` from its init state. With
    ``stages`` > 1 the copies are stepped in pipeline stages (`_pipelined_round`).
    `capture` records a few copies' pictures for episode videos (copies of the first
    stage, when there are stages)."""
    # What the CPU envs are told; the algorithm moves what it keeps to its device.
    indices = torch.tensor(init_state_indices, dtype=torch.long, device="cpu")
    groups = first_group_index + torch.arange(env.num_envs, device="cpu") // group_size
    if stages > 1:
        return _pipelined_round(
            env, algorithm, task_id, indices, groups, horizons, num_steps, stages, capture
        )
    obs = env.reset(task_id, env.init_states(task_id)[indices])
    algorithm.start_round(horizons, num_steps)
    if capture is not None:
        capture.start()
    ended = torch.zeros(env.num_envs, dtype=torch.bool, device="cpu")
    for _ in range(num_steps):
        step = env.step(algorithm.act(obs))
        algorithm.process_env_step(step)
        if capture is not None:
            capture.step(step)
        ended |= step.done
        obs = step.obs
        if bool(ended.all()):
            break
    _check_all_ended(ended, num_steps)
    return algorithm.finish_round(task_id, indices, groups)


def _check_all_ended(ended: torch.Tensor, num_steps: int) -> None:
    if not bool(ended.all()):
        # Rounds are as long as the env's step limit, so an env that truncates at its
        # limit always ends its episodes here; nothing is left for a critic to bootstrap.
        raise RuntimeError(
            f"{int((~ended).sum())} episodes were still running after {num_steps} steps: "
            "the env must end every episode within env.max_episode_steps"
        )


def _pipelined_round(
    env: VectorEnv,
    algorithm: OnPolicyAlgorithm,
    task_id: int,
    indices: torch.Tensor,
    groups: torch.Tensor,
    horizons: torch.Tensor,
    num_steps: int,
    stages: int,
    capture: RoundCapture | None = None,
) -> Trajectories:
    """The round with the env workers in `stages` groups, each group's copies a rollout
    of their own (plans, storage): while one stage's workers simulate, the policy
    decides the next stage's actions, so inference and simulation overlap instead of
    taking turns. Each stage's episodes are the ones the plain round would run."""
    if not hasattr(env, "step_async"):
        raise ValueError("pipeline stages need placed env workers (cluster env processes)")
    workers = env.stage_workers(stages)
    sizes = env.stage_sizes(stages)
    obs = env.reset(task_id, env.init_states(task_id)[indices]).split(sizes)
    if capture is not None:
        capture.start()
    lanes, in_flight = [], []
    original = algorithm.swap_rollout(RolloutState())
    for stage, stage_horizons in enumerate(horizons.split(sizes)):
        algorithm.start_round(stage_horizons, num_steps)
        actions = algorithm.act(obs[stage])
        in_flight.append(env.step_async(actions, workers[stage]))
        lanes.append(algorithm.swap_rollout(RolloutState()))
    algorithm.swap_rollout(original)
    ended = [torch.zeros(size, dtype=torch.bool, device="cpu") for size in sizes]
    for step_index in range(num_steps):
        for stage, calls in enumerate(in_flight):
            if calls is None:
                continue
            step = env.step_wait(calls)
            if stage == 0 and capture is not None:  # before its workers step again
                capture.step(step)
            outer = algorithm.swap_rollout(lanes[stage])
            algorithm.process_env_step(step)
            ended[stage] |= step.done
            last = bool(ended[stage].all()) or step_index == num_steps - 1
            # This stage's next decision, while the other stages' workers step.
            in_flight[stage] = (
                None if last else env.step_async(algorithm.act(step.obs), workers[stage])
            )
            lanes[stage] = algorithm.swap_rollout(outer)
        if all(calls is None for calls in in_flight):
            break
    _check_all_ended(torch.cat(ended), num_steps)
    parts = []
    for lane, stage_indices, stage_groups in zip(
        lanes, indices.split(sizes), groups.split(sizes), strict=True
    ):
        outer = algorithm.swap_rollout(lane)
        parts.append(algorithm.finish_round(task_id, stage_indices, stage_groups))
        algorithm.swap_rollout(outer)
    return concat_trajectories(parts)


@dataclass
class CollectedBatch:
    batch: Trajectories  # exactly data_batch_size trajectories
    episodes: list[Trajectories]  # every round run this iteration (for metrics)
    rounds: int
    masked_trajectories: int
    warning: str | None
    # Of the groups of every round run, those whose scores differ: the groups a
    # group-relative advantage can learn from (0 of 0 without groups).
    informative_groups: int = 0
    groups: int = 0


def collect_exact_batch(
    next_round: Callable[[], Trajectories],
    data_batch_size: int,
    round_size: int,
    group_size: int = 1,
    filter_groups: bool = False,
    max_attempts: int = 1,
    scores: Callable[[Trajectories], torch.Tensor] | None = None,
) -> CollectedBatch:
    """Run rounds until ``data_batch_size`` trajectories are kept, then trim to exactly
    that many (whole groups, since sizes are multiples of ``group_size``).

    With ``filter_groups``, groups whose ``scores`` (default: success) are all equal are
    set aside and more
    rounds run, for at most ``max_attempts`` passes (a pass being the rounds one full
    batch needs). If the batch is still short, it is completed with set-aside groups
    whose loss mask is 0 and a warning is logged: when every rollout succeeds (or
    fails) resampling can never help, and RIPT-VLA's unbounded loop would hang there.
    With groups, the informative ones are counted whether or not they are filtered.
    """
    if data_batch_size % group_size or round_size % group_size:
        raise ValueError("data_batch_size and the round size must be multiples of group_size")
    rounds_per_pass = -(-data_batch_size // round_size)
    max_rounds = rounds_per_pass * (max_attempts if filter_groups else 1)
    kept: list[Trajectories] = []
    set_aside: list[Trajectories] = []
    episodes: list[Trajectories] = []
    kept_count = 0
    rounds = 0
    informative = groups = 0
    while kept_count < data_batch_size and rounds < max_rounds:
        trajectories = next_round()
        rounds += 1
        episodes.append(trajectories)
        if filter_groups or group_size > 1:
            score = scores(trajectories) if scores else trajectories.policy_success.float()
            mixed = informative_groups(score, group_size)
            if group_size > 1:  # a rollout alone is no group to compare within
                informative += int(mixed.sum())
                groups += mixed.numel()
        if filter_groups:
            keep = mixed.repeat_interleave(group_size)
            kept.append(trajectories.select(keep))
            set_aside.append(trajectories.select(~keep))
        else:
            kept.append(trajectories)
        kept_count += kept[-1].num_episodes
    warning = None
    masked = 0
    if kept_count < data_batch_size:
        masked = data_batch_size - kept_count
        filler = concat_trajectories(set_aside)
        filler = filler.select(torch.arange(masked, device=filler.valid.device))
        kept.append(filler.with_loss_mask(torch.zeros(masked, device=filler.valid.device)))
        warning = (
            f"group filter: only {kept_count} of {data_batch_size} trajectories came from "
            f"groups whose scores differ after {rounds} rounds "
            f"({max_attempts} attempts); training on the rest with loss mask 0"
        )
        log.warning(warning)
    batch = concat_trajectories(kept)
    return CollectedBatch(
        batch=batch.select(torch.arange(data_batch_size, device=batch.valid.device)),
        episodes=episodes,
        rounds=rounds,
        masked_trajectories=masked,
        warning=warning,
        informative_groups=informative,
        groups=groups,
    )
