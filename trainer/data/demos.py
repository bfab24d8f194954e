"""Demonstrations for RLPD's demo buffer: a `.npz` file of transitions or a LeRobot
dataset folder (`trainer.data.lerobot_dataset`), and recording them from an action
source (a scripted operator, or a human through the console).

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
reads it anywhere. A dataset holds the same transitions as LeRobot frames, one episode
after another; its episodes' last frames keep no true final observation.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from trainer.data.demo_errors import DemoFileError
from trainer.data.replay import TRANSITION_FIELDS, Batch, transition_batch
from trainer.envs.intervention import ActionSource, InterventionEnv
from trainer.envs.vector_env import VectorEnv
from trainer.envs.vision_language import VisionLanguageSpec

FORMAT_VERSION = 1
REQUIRED = ("obs", "action", "reward", "next_obs", "terminal")


def save_demos(
    path: str | Path,
    demos: Batch,
    vision_language: VisionLanguageSpec | None = None,
    fps: int | None = None,
    task_ids: torch.Tensor | None = None,
    task_names: Sequence[str] | None = None,
) -> Path:
    """Write `demos` to `path`: a `.npz` file when the name ends so, else a LeRobot
    dataset folder (replacing a dataset there), whose vision-language rows
    `vision_language` splits into pictures, proprio and instruction; `fps` (default
    `lerobot_dataset.DEFAULT_FPS`), `task_ids` and `task_names` are the dataset's
    (`trainer.data.lerobot_dataset.write_dataset`)."""
    path = Path(path)
    if path.suffix != ".npz":
        # Imported here: pyarrow loads only where datasets are read or written.
        from trainer.data.lerobot_dataset import DEFAULT_FPS, write_dataset

        fps = fps or DEFAULT_FPS
        return write_dataset(path, demos, fps, vision_language, None, task_ids, task_names)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {name: demos[name].cpu().numpy() for name in TRANSITION_FIELDS if name in demos}
    with path.open("wb") as file:  # savez would append ".npz" to a name without it
        np.savez_compressed(file, format_version=np.int64(FORMAT_VERSION), **arrays)
    return path


def load_demos(path: str | Path, vision_language: VisionLanguageSpec | None = None) -> Batch:
    """The transitions of a demo file, checked against the format above, or of a LeRobot
    dataset folder (one with meta/info.json), whose pictures, proprio and instructions
    `vision_language` packs into the env's rows."""
    path = Path(path)
    if path.is_dir():
        from trainer.data.lerobot_dataset import read_dataset

        return read_dataset(path, vision_language)
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
    # One episode after another, each in time order, as a dataset stores them.
    copy_index, step_index = (torch.stack(alive_at) & keep_copy).T.nonzero(as_tuple=True)
    stacked = {name: torch.stack([batch[name] for batch in steps]) for name in steps[0]}
    return [{name: tensor[step_index, copy_index] for name, tensor in stacked.items()}]
