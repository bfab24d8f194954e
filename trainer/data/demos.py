"""Demonstrations for RLPD's demo buffer: one `.npz` file of transitions, and recording
one from an action source (a scripted operator, or a human through the console).

The file holds one array per transition field, all with the same first dimension:

- `obs` `[N, *obs_shape]` float32 (camera images `[N, C, H, W]` also as uint8, which is
  how they are recorded): the observation the action was chosen in;
- `action` `[N, action_dim]` float32: the action executed, in [-1, 1];
- `reward` `[N]` float32: the step's reward;
- `next_obs` `[N, *obs_shape]`, as `obs`: the next observation (at an episode's end the
  true final one, not the reset's);
- `terminal` `[N]` bool: the episode reached a terminal state (success); a time-out is
  not terminal;
- `intervened` `[N]` bool, optional: a human chose the action (default: all true);

plus `format_version` (a scalar, 1). `np.savez_compressed` writes it; `numpy.load`
reads it anywhere.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from trainer.data.replay import TRANSITION_FIELDS, Batch, transition_batch
from trainer.envs.intervention import ActionSource, InterventionEnv
from trainer.envs.vector_env import VectorEnv

FORMAT_VERSION = 1
REQUIRED = ("obs", "action", "reward", "next_obs", "terminal")


class DemoFileError(ValueError):
    """A demo file that cannot be used; the message names the file and the array."""


def save_demos(path: str | Path, demos: Batch) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {name: demos[name].cpu().numpy() for name in TRANSITION_FIELDS if name in demos}
    with path.open("wb") as file:  # savez would append ".npz" to a name without it
        np.savez_compressed(file, format_version=np.int64(FORMAT_VERSION), **arrays)
    return path


def load_demos(path: str | Path) -> Batch:
    """The transitions of a demo file, checked against the format above."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
    except (OSError, ValueError) as error:
        raise DemoFileError(f"{path}: not a readable .npz demo file ({error})") from error
    version = int(arrays.pop("format_version", -1))
    if version != FORMAT_VERSION:
        raise DemoFileError(f"{path}: format_version {version}, expected {FORMAT_VERSION}")
    missing = [name for name in REQUIRED if name not in arrays]
    if missing:
        raise DemoFileError(f"{path}: missing arrays {', '.join(missing)}")
    unknown = sorted(set(arrays) - set(TRANSITION_FIELDS))
    if unknown:
        raise DemoFileError(f"{path}: unknown arrays {', '.join(unknown)}")
    rows = arrays["obs"].shape[0]
    for name, array in arrays.items():
        if array.shape[0] != rows:
            raise DemoFileError(f"{path}: {name} has {array.shape[0]} rows, obs has {rows}")
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            raise DemoFileError(f"{path}: {name} holds NaN or infinite values")
    if arrays["next_obs"].shape != arrays["obs"].shape:
        raise DemoFileError(
            f"{path}: next_obs has shape {arrays['next_obs'].shape}, obs {arrays['obs'].shape}"
        )
    for name in ("action", "obs", "next_obs", "reward"):
        if not (name.endswith("obs") and arrays[name].dtype == np.uint8):  # images stay compact
            arrays[name] = arrays[name].astype(np.float32)
    arrays.setdefault("intervened", np.ones(rows, dtype=bool))
    for name in ("terminal", "intervened"):
        arrays[name] = arrays[name].astype(bool)
    return {name: torch.from_numpy(arrays[name]) for name in TRANSITION_FIELDS}


def record_demos(
    env: VectorEnv, source: ActionSource, task_ids: list[int], rounds: int = 1,
    successful_only: bool = True,
) -> Batch:  # fmt: skip
    """Run every copy of `env` through one episode per round per task with `source`
    in control, starting from the task's first init states; the transitions of the
    episodes (only the successful ones by default)."""
    wrapped = InterventionEnv(env, source)
    parts: list[Batch] = []
    for task_id in task_ids:
        states = env.init_states(task_id)
        for round_index in range(rounds):
            index = (torch.arange(env.num_envs) + round_index * env.num_envs) % len(states)
            parts += _one_episode_each(wrapped, task_id, states[index], successful_only)
    if not parts:
        raise ValueError("the source completed no episode to record")
    return {name: torch.cat([part[name] for part in parts]) for name in TRANSITION_FIELDS}


def _one_episode_each(
    env: InterventionEnv, task_id: int, init_states: torch.Tensor, successful_only: bool
) -> list[Batch]:
    obs = env.reset(task_id, init_states)
    zeros = torch.zeros(env.num_envs, env.action_dim)  # the source takes over every copy
    steps: list[Batch] = []
    running = torch.ones(env.num_envs, dtype=torch.bool)
    success = torch.zeros(env.num_envs, dtype=torch.bool)
    alive_at: list[torch.Tensor] = []
    while bool(running.any()):
        step = env.step(zeros)
        steps.append(transition_batch(obs, zeros, step))
        alive_at.append(running.clone())
        success |= running & step.success
        running &= ~step.done
        obs = step.obs
    keep_copy = success if successful_only else torch.ones_like(success)
    return [
        {name: tensor[alive & keep_copy] for name, tensor in batch.items()}
        for batch, alive in zip(steps, alive_at, strict=True)
    ]
