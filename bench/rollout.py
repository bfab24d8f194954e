"""Benchmark: env actions per second of our rollout loop vs the raw env, same actions.

Ours is the runner's collection path, `trainer.runner.collection.run_round`: reset the
copies to init states, then per decision the plan cache names the slots to replan, the
policy plans them, the env steps the chunk, and `process_env_step` stores the
transition (with the time-out bootstrap); `finish_round` builds the trajectories and
the critic values them in one batch. The baseline steps the same env with nothing
else: `reset` to the same init states, then `step` with the very actions our loop sent
(recorded on the way), so both runs execute the same env actions and the ratio is the
share of time left to the env. Each repeat runs ours and its baselines back to back;
the ratios are medians of each repeat's own ratio.

Two envs, each its own RESULT line (target ratio >= 0.9):
- `rollout_builtin`: the built-in env (torch, 0.7-3 M actions/s depending on the
  machine). The env is so cheap that the model's own arithmetic (the policy forward
  for the slots that replan, the critic's values) costs about half as much as
  stepping it, so no loop that runs a neural policy can reach 0.9 here. A second
  line, `rollout_builtin_loop`, separates the loop's own cost: its baseline is the raw
  env plus those very model calls (same rows, same batch sizes) timed on their own,
  so its ratio is the share of our time that is env or model, and 1 - ratio is what
  the loop itself adds.
- `rollout_libero`: LIBERO libero_spatial task 0, state-only, 2 copies in 2 worker
  processes (what `env.num_workers: 2` runs). Skipped with a note when LIBERO is not
  installed (`./armature install-libero`).

    .venv/bin/python bench/rollout.py [--repeats 21] [--libero-repeats 5] [--builtin-envs 256]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.config import validate_config  # noqa: E402
from trainer.data.rollout_storage import Trajectories  # noqa: E402
from trainer.envs import EnvStep, LiberoNotInstalledError, VectorEnv  # noqa: E402
from trainer.envs.libero_setup import check_libero_installed  # noqa: E402
from trainer.models.plan_cache import assign_horizons  # noqa: E402
from trainer.runner.build import Components, build_components  # noqa: E402
from trainer.runner.collection import run_round  # noqa: E402


class RecordingEnv(VectorEnv):
    """Passes everything through and keeps the actions (one list append per step)."""

    def __init__(self, env: VectorEnv) -> None:
        self.env = env
        self.num_envs = env.num_envs
        self.num_tasks = env.num_tasks
        self.obs_shape = env.obs_shape
        self.action_dim = env.action_dim
        self.max_episode_steps = env.max_episode_steps
        self.actions: list[torch.Tensor] = []
        self.executed = 0

    def init_states(self, task_id: int) -> torch.Tensor:
        return self.env.init_states(task_id)

    def task_name(self, task_id: int) -> str:
        return self.env.task_name(task_id)

    def reset(self, task_id: int, init_states: torch.Tensor) -> torch.Tensor:
        self.actions = []
        self.executed = 0
        return self.env.reset(task_id, init_states)

    def step(self, actions: torch.Tensor) -> EnvStep:
        self.actions.append(actions)
        step = self.env.step(actions)
        self.executed += int(step.executed_actions.sum())
        return step


def build(env_section: dict[str, Any], hidden: list[int]) -> Components:
    config = validate_config(
        {
            "env": env_section,
            "actor": {"model": {"num_action_chunks": 5, "hidden_sizes": hidden}},
            "critic": {"hidden_sizes": hidden},
            "rollout": {"action_horizons_pattern": [5, 10, 15]},
            "algorithm": {"name": "ppo"},
        }
    )
    return build_components(config, torch.Generator().manual_seed(0))


def init_state_indices(env: VectorEnv, task_id: int) -> list[int]:
    available = int(env.init_states(task_id).shape[0])
    return [slot % available for slot in range(env.num_envs)]


def ours_round(
    parts: Components, recorder: RecordingEnv, task_id: int
) -> tuple[float, int, Trajectories]:
    """One collection round of the runner: (seconds, env actions executed, the round)."""
    env = recorder.env
    indices = init_state_indices(env, task_id)
    horizons = assign_horizons([5, 10, 15], env.num_envs)
    steps = -(-env.max_episode_steps // parts.algorithm.chunk)
    started = time.perf_counter()
    trajectories = run_round(recorder, parts.algorithm, task_id, indices, horizons, steps)
    return time.perf_counter() - started, recorder.executed, trajectories


def raw_round(env: VectorEnv, task_id: int, actions: list[torch.Tensor]) -> tuple[float, int]:
    """The same reset and actions, stepped directly."""
    states = env.init_states(task_id)[init_state_indices(env, task_id)]
    executed = 0
    started = time.perf_counter()
    env.reset(task_id, states)
    for action in actions:
        executed += int(env.step(action).executed_actions.sum())
    return time.perf_counter() - started, executed


@torch.no_grad()
def model_seconds(parts: Components, round_: Trajectories, steps: int) -> float:
    """The model calls our round made, on their own: per decision the policy plans the
    slots whose chunk offset is 0 (the ones that replanned) as far as the longest of
    their horizons, the critic values the timed-out rows (the time-out bootstrap;
    the same number of rows), then the round's valid rows in one batch."""
    policy, critic = parts.algorithm.policy, parts.algorithm.critic
    started = time.perf_counter()
    for t in range(steps):
        replanned = (round_.chunk_offset[t] == 0).nonzero().squeeze(1)
        horizons = round_.plan_horizon[t, replanned]
        plan_steps = int(horizons.max())
        policy.sample_plan(
            round_.obs[t, replanned], horizons, steps=plan_steps, chunk=parts.algorithm.chunk
        )
        timeout = round_.timeout[t]
        if critic is not None and bool(timeout.any()):
            plan = (round_.plan_horizon[t, timeout], round_.chunk_offset[t, timeout])
            critic(round_.obs[t, timeout], *plan)
    if critic is not None:
        valid = round_.valid
        critic(round_.obs[valid], round_.plan_horizon[valid], round_.chunk_offset[valid])
    return time.perf_counter() - started


@dataclass
class Measurement:
    """Medians over the repeats. The ratios are medians of each repeat's own ratio
    (ours and its baselines run back to back), which cancels the machine's drift
    between repeats better than a ratio of medians."""

    ours: float
    raw: float
    floor: float
    ratio: float
    floor_ratio: float


def measure(parts: Components, task_id: int, repeats: int) -> Measurement:
    """Env actions/s of ours, of the raw env, and of the raw env plus the model's own
    calls, each repeat running the three back to back."""
    recorder = RecordingEnv(parts.env)
    ours_rates, raw_rates, floor_rates = [], [], []
    ours_round(parts, recorder, task_id)  # warm-up (first plans, lazy simulator state)
    for _ in range(repeats):
        seconds, executed, round_ = ours_round(parts, recorder, task_id)
        ours_rates.append(executed / seconds)
        raw_seconds, raw_executed = raw_round(parts.env, task_id, recorder.actions)
        if raw_executed != executed:
            raise AssertionError(f"replay executed {raw_executed} actions, ours {executed}")
        raw_rates.append(raw_executed / raw_seconds)
        model = model_seconds(parts, round_, len(recorder.actions))
        floor_rates.append(raw_executed / (raw_seconds + model))
    median = statistics.median
    return Measurement(
        ours=median(ours_rates),
        raw=median(raw_rates),
        floor=median(floor_rates),
        ratio=median(o / r for o, r in zip(ours_rates, raw_rates, strict=True)),
        floor_ratio=median(o / f for o, f in zip(ours_rates, floor_rates, strict=True)),
    )


def libero_skip_reason(repeats: int) -> str | None:
    if repeats < 1:
        return "--libero-repeats 0"
    try:
        check_libero_installed()
    except LiberoNotInstalledError as error:
        return str(error)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21, help="built-in env rounds (>= 1)")
    parser.add_argument("--libero-repeats", type=int, default=5, help="LIBERO rounds; 0 skips")
    parser.add_argument("--builtin-envs", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)

    results = []
    builtin = build(
        {"name": "builtin_reach", "num_parallel_envs": args.builtin_envs}, hidden=[64, 64]
    )
    got = measure(builtin, task_id=0, repeats=args.repeats)
    print(
        f"builtin_reach, {args.builtin_envs} copies: ours {got.ours:,.0f} actions/s, "
        f"raw {got.raw:,.0f}, raw env + the model's calls alone {got.floor:,.0f}"
    )
    results += [
        ("rollout_builtin", got.ours, got.raw, got.ratio),
        ("rollout_builtin_loop", got.ours, got.floor, got.floor_ratio),
    ]

    skip = libero_skip_reason(args.libero_repeats)
    if skip:
        print(f"note: skipping the LIBERO part: {skip}")
    else:
        libero = build(
            {
                "name": "libero",
                "suite": "libero_spatial",
                "num_parallel_envs": 2,
                "num_workers": 2,
                "max_episode_steps": 100,
            },
            hidden=[64, 64],
        )
        try:
            got = measure(libero, task_id=0, repeats=args.libero_repeats)
        finally:
            libero.env.close()
        print(
            f"libero_spatial state-only, 2 copies / 2 workers: "
            f"ours {got.ours:.1f}, raw {got.raw:.1f}"
        )
        results.append(("rollout_libero", got.ours, got.raw, got.ratio))

    for name, ours, baseline, ratio in results:
        print(
            f"RESULT bench={name} ours={ours:.1f} baseline={baseline:.1f} "
            f"ratio={ratio:.3f} unit=steps/s better=higher"
        )


if __name__ == "__main__":
    main()
