"""Demonstrations as LeRobot datasets (codebase version v3.0, the format of the `lerobot`
package 0.4): `write_dataset` turns demo transitions into one, `read_dataset` turns one
into demo transitions (the fields of `trainer.data.demos`). The files themselves are
`trainer.data.lerobot_format`'s.

One LeRobot episode per demo episode (`trainer.data.demo_episodes` finds them), one
frame per transition, with the feature names LeRobot's own recorders use:

- `observation.state` float32: the whole observation of a state env; the proprio of a
  vision-language row, whose pictures are `observation.images.camera0`, `camera1`, ...
  (`image` features, `[H, W, C]` uint8) and whose instruction is the frame's task;
- `observation.images.camera0` alone: the whole observation of an image env (its
  `[C, H, W]` rows; no state);
- `action` float32; `next.reward` float32 `[1]`;
- `next.done` bool `[1]`: the episode ends after this step (success or time-out), as
  LeRobot's HIL-SERL recorder (lerobot/rl/gym_manipulator.py) writes it;
- `next.success` bool `[1]`: it ends in success (the name of LeRobot's evaluation
  recordings), which is what a demo's `terminal` is;
- `complementary_info.is_intervention` bool `[1]`: a human chose the action (LeRobot's
  `complementary_info.<key>` columns and its TeleopEvents.IS_INTERVENTION key);
- the frame's `task`: the env's instruction for a vision-language row; for state rows,
  `task_names[task_ids[row]]` when the caller knows them, else one task for all.

Reading follows LeRobot's RL replay buffer (lerobot/rl/buffer.py, from_lerobot_dataset):
a frame's next observation is the next frame's in its episode, and the last frame's is
its own (the true final observation is not stored); without `next.done` an episode's
last frame is done. A frame is terminal where `next.success` says so; without it where
it is done and not `next.truncated`; without that where it is done with a positive
reward (LeRobot's recorder ends an episode on success with reward 1, on a time-out with
0); without rewards where it is done. Without `complementary_info.is_intervention`
every action counts as a human's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from trainer.data.demo_episodes import split_episodes
from trainer.data.demo_errors import DemoFileError
from trainer.data.lerobot_format import (
    CAMERA_DTYPES,
    image_feature,
    picture_shape,
    read_frames,
    read_info,
    vector_feature,
    write_frames,
)
from trainer.data.replay import Batch
from trainer.envs.vision_language import VisionLanguageSpec

STATE = "observation.state"
CAMERA = "observation.images.camera{index}"
ACTION = "action"
REWARD = "next.reward"
DONE = "next.done"
SUCCESS = "next.success"
TRUNCATED = "next.truncated"
INTERVENTION = "complementary_info.is_intervention"
OPTIONAL_FEATURES = (REWARD, DONE, SUCCESS, TRUNCATED, INTERVENTION)
# robosuite's (and so LIBERO's) control rate; the built-in env keeps no clock.
DEFAULT_FPS = 20
UNNAMED_TASK = "demonstration"  # the task of state rows whose task ids are not given


def write_dataset(
    folder: str | Path,
    demos: Batch,
    fps: int = DEFAULT_FPS,
    vision_language: VisionLanguageSpec | None = None,
    robot_type: str | None = None,
    task_ids: torch.Tensor | None = None,
    task_names: Sequence[str] | None = None,
) -> Path:
    """Write `demos` (the transition fields) as a dataset at `folder`, replacing a
    dataset there. Rows of a vision-language env are split into pictures, proprio and
    instruction by `vision_language`; state rows may be labelled by `task_ids [N]`
    (default: one task) and `task_names` (default: "task <id>")."""
    if demos["obs"].shape[0] == 0:
        raise ValueError("no transitions to write")
    # Files are written from host memory, whatever device the rows come from.
    demos = {name: tensor.cpu() for name, tensor in demos.items()}
    episodes = split_episodes(demos)
    lengths = [len(episode) for episode in episodes]
    order = torch.cat(episodes)
    rows = {name: tensor[order] for name, tensor in demos.items()}
    count = int(order.numel())
    columns: dict[str, np.ndarray] = {}
    features: dict[str, dict] = {}
    if vision_language is not None:
        tasks = _picture_columns(rows["obs"], vision_language, columns, features)
    elif rows["obs"].dim() == 4:  # an image env's [C, H, W] rows: one camera, no state
        name = CAMERA.format(index=0)
        columns[name] = _uint8(rows["obs"]).permute(0, 2, 3, 1).contiguous().numpy()
        features[name] = image_feature(*columns[name].shape[1:])
        tasks = _state_tasks(order, count, task_ids, task_names)
    else:
        if rows["obs"].dim() != 2:
            raise ValueError(
                f"obs rows of shape {tuple(rows['obs'].shape[1:])}: without a "
                "vision_language spec, state vectors or [C, H, W] images are written"
            )
        columns[STATE] = rows["obs"].float().numpy()
        features[STATE] = vector_feature(columns[STATE].shape[1])
        tasks = _state_tasks(order, count, task_ids, task_names)
    columns[ACTION] = rows["action"].float().numpy()
    features[ACTION] = vector_feature(columns[ACTION].shape[1])
    done = torch.zeros(count, dtype=torch.bool, device="cpu")
    ends = torch.tensor(lengths, device="cpu").cumsum(0) - 1
    done[ends] = True  # LeRobot's recorder: the episode ends
    intervened = rows.get("intervened", torch.ones(count, dtype=torch.bool, device="cpu"))
    scalars = {
        REWARD: rows["reward"].float(),
        DONE: done,
        SUCCESS: rows["terminal"].bool(),
        INTERVENTION: intervened.bool(),
    }
    for name, values in scalars.items():
        columns[name] = values.reshape(count, 1).numpy()
        features[name] = vector_feature(1, "float32" if values.is_floating_point() else "bool")
    return write_frames(Path(folder), features, columns, lengths, tasks, fps, robot_type)


def _picture_columns(
    obs: torch.Tensor, spec: VisionLanguageSpec, columns: dict, features: dict
) -> list[str]:
    """Fill in the pictures and proprio of vision-language rows; their instructions."""
    images, proprio, task_ids = spec.unpack(obs.float())
    outside = sorted(set(task_ids.tolist()) - set(range(len(spec.instructions))))
    if outside:
        raise ValueError(f"task ids {outside} in the rows, the env has {len(spec.instructions)}")
    pictures = _uint8(images)
    for camera in range(spec.num_images):
        name = CAMERA.format(index=camera)
        columns[name] = pictures[:, camera].permute(0, 2, 3, 1).contiguous().numpy()
        features[name] = image_feature(*columns[name].shape[1:])
    columns[STATE] = proprio.contiguous().numpy()
    features[STATE] = vector_feature(spec.proprio_dim)
    return [spec.instructions[task] for task in task_ids.tolist()]


def _uint8(images: torch.Tensor) -> torch.Tensor:
    """Pictures as uint8: floats in [0, 1] scaled, uint8 (the buffers' rows) as they are."""
    if images.dtype == torch.uint8:
        return images
    return images.float().mul(255.0).round_().clamp_(0, 255).to(torch.uint8)


def _state_tasks(
    order: torch.Tensor,
    count: int,
    task_ids: torch.Tensor | None,
    task_names: Sequence[str] | None,
) -> list[str]:
    if task_ids is None:
        return [UNNAMED_TASK] * count
    ids = task_ids[order].tolist()
    if task_names is None:
        return [f"task {task}" for task in ids]
    return [task_names[task] for task in ids]


def read_dataset(folder: str | Path, vision_language: VisionLanguageSpec | None = None) -> Batch:
    """The transitions of the dataset at `folder`, in the demo fields. With
    `vision_language`, each row is packed from the frame's pictures (its camera
    features in the order info.json lists them), `observation.state` as proprio and
    the task id whose instruction is the frame's task."""
    folder = Path(folder)
    features = read_info(folder)["features"]
    cameras = [name for name, feature in features.items() if feature["dtype"] in CAMERA_DTYPES]
    # An image env's rows: one camera and no state.
    image_rows = vision_language is None and STATE not in features and len(cameras) == 1
    needed = (ACTION,) if image_rows else (STATE, ACTION)
    missing = [name for name in needed if name not in features]
    if missing:
        raise DemoFileError(
            f"{folder}: no feature {', '.join(missing)} (demos need {ACTION}, and "
            f"{STATE} or, for an image env's rows, one camera)"
        )
    if vision_language is not None:
        _check_cameras(folder, features, cameras, vision_language)
    elif not image_rows:
        cameras = []  # a state env's rows have no pictures
    optional = [name for name in OPTIONAL_FEATURES if name in features]
    state_names = [] if image_rows else [STATE]
    frames = read_frames(folder, [*state_names, ACTION, *cameras, *optional])
    columns = frames.columns
    count = len(columns["index"])
    if count == 0:
        raise DemoFileError(f"{folder}: the dataset has no frames")
    episode = columns["episode_index"]
    last = np.append(episode[1:] != episode[:-1], True)
    if image_rows:  # [N, H, W, C] uint8 -> [N, C, H, W], as the buffers keep them
        obs = torch.from_numpy(np.ascontiguousarray(columns[cameras[0]])).permute(0, 3, 1, 2)
    elif vision_language is not None:
        state = torch.from_numpy(columns[STATE].astype(np.float32).reshape(count, -1))
        obs = _packed_rows(folder, frames.tasks, columns, cameras, state, vision_language)
    else:
        obs = torch.from_numpy(columns[STATE].astype(np.float32).reshape(count, -1))
    following = np.arange(count) + 1
    following[last] = np.flatnonzero(last)  # the last frame's next observation is its own
    per_frame = {name: columns[name].reshape(count, -1)[:, 0] for name in optional}
    reward = per_frame.get(REWARD, np.zeros(count)).astype(np.float32)
    done = per_frame.get(DONE, last).astype(bool)
    if SUCCESS in per_frame:
        terminal = per_frame[SUCCESS].astype(bool)
    elif TRUNCATED in per_frame:
        terminal = done & ~per_frame[TRUNCATED].astype(bool)
    elif REWARD in per_frame:
        terminal = done & (reward > 0)
    else:
        terminal = done
    intervened = per_frame.get(INTERVENTION, np.ones(count)) != 0
    demos = {
        "obs": obs,
        "action": torch.from_numpy(columns[ACTION].astype(np.float32).reshape(count, -1)),
        "reward": torch.from_numpy(reward),
        "next_obs": obs[torch.from_numpy(following)],
        "terminal": torch.from_numpy(terminal),
        "intervened": torch.from_numpy(intervened),
    }
    for name in ("obs", "action", "reward"):
        if not bool(torch.isfinite(demos[name]).all()):
            raise DemoFileError(f"{folder}: the frames' {name} holds NaN or infinite values")
    return demos


def _check_cameras(
    folder: Path, features: dict, cameras: list[str], spec: VisionLanguageSpec
) -> None:
    if len(cameras) != spec.num_images:
        raise DemoFileError(
            f"{folder}: {len(cameras)} camera features ({', '.join(cameras) or 'none'}), "
            f"the env's rows hold {spec.num_images} pictures"
        )
    channels, height, width = spec.image_shape
    for name in cameras:
        shape = picture_shape(features[name])
        if shape != (height, width, channels):
            raise DemoFileError(
                f"{folder}: feature {name} has pictures of shape {list(shape)} (H, W, C), "
                f"the env's are {[height, width, channels]}; resize the dataset's pictures"
            )
    state = tuple(features[STATE]["shape"])
    if state != (spec.proprio_dim,):
        raise DemoFileError(
            f"{folder}: feature {STATE} has shape {list(state)}, the env's proprio "
            f"[{spec.proprio_dim}]"
        )


def _packed_rows(
    folder: Path,
    tasks: list[str],
    columns: dict[str, np.ndarray],
    cameras: list[str],
    proprio: torch.Tensor,
    spec: VisionLanguageSpec,
) -> torch.Tensor:
    task_of = {instruction: task for task, instruction in enumerate(spec.instructions)}
    unknown = [task for task in dict.fromkeys(tasks) if task not in task_of]
    if unknown:
        raise DemoFileError(
            f"{folder}: task {unknown[0]!r} is none of the env's instructions "
            f"({len(spec.instructions)} of them, e.g. {spec.instructions[0]!r})"
        )
    task_ids = torch.tensor([task_of[task] for task in tasks], dtype=torch.long, device="cpu")
    pictures = np.stack([columns[name] for name in cameras], axis=1)  # [N, cams, H, W, C]
    images = torch.from_numpy(pictures).permute(0, 1, 4, 2, 3)
    return spec.pack(images, proprio, task_ids)
