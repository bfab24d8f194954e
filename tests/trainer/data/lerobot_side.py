"""LeRobot's own dataset code, run by the interop tests in the side virtualenv that
`./armature install-lerobot` builds (lerobot cannot share the project's venv). It
imports nothing of the project: only the standard library, numpy and lerobot.

    python lerobot_side.py write FRAMES.npz FEATURES.json ROOT FPS {images,videos}
        records a dataset with LeRobotDataset.create / add_frame / save_episode /
        finalize from the frames in FRAMES.npz: one array per feature, `task` (strings)
        and `episode` (the episode of each frame, episodes one after another);
    python lerobot_side.py read ROOT OUT.npz
        opens ROOT with LeRobotDataset(repo_id, root=ROOT) and writes every frame's
        features to OUT.npz (images back to HWC uint8, `task` as strings), and what
        LeRobot's RL replay buffer (ReplayBuffer.from_lerobot_dataset) makes of the
        state, where there is one: `buffer.next_state`, `buffer.done`, `buffer.reward`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from lerobot.datasets.lerobot_dataset import LeRobotDataset
from lerobot.rl.buffer import ReplayBuffer

REPO_ID = "armature/interop"


def write(frames_path: str, features_path: str, root: str, fps: str, storage: str) -> None:
    features = json.loads(Path(features_path).read_text())
    for feature in features.values():
        feature["shape"] = tuple(feature["shape"])
    with np.load(frames_path, allow_pickle=False) as data:
        frames = {name: data[name] for name in data.files}
    dataset = LeRobotDataset.create(
        REPO_ID, int(fps), features=features, root=root, use_videos=storage == "videos"
    )
    episodes = frames.pop("episode")
    tasks = frames.pop("task")
    for row, episode in enumerate(episodes):
        frame = {name: frames[name][row] for name in features}
        dataset.add_frame({**frame, "task": str(tasks[row])})
        if row + 1 == len(episodes) or episodes[row + 1] != episode:
            dataset.save_episode()
    dataset.finalize()


def read(root: str, out_path: str) -> None:
    dataset = LeRobotDataset(REPO_ID, root=root)
    columns: dict[str, list] = {}
    for index in range(len(dataset)):
        for name, value in dataset[index].items():
            columns.setdefault(name, []).append(value)
    arrays = {}
    for name, values in columns.items():
        if name == "task":
            arrays[name] = np.array(values, dtype=str)
        elif name in dataset.meta.camera_keys:  # [C, H, W] floats in [0, 1] -> HWC uint8
            images = np.stack([value.numpy() for value in values])
            arrays[name] = np.round(images.transpose(0, 2, 3, 1) * 255).astype(np.uint8)
        else:
            arrays[name] = np.stack([np.asarray(value) for value in values])
    arrays["info.fps"] = np.array(dataset.fps)
    arrays["info.total_episodes"] = np.array(dataset.meta.total_episodes)
    if "observation.state" in dataset.meta.features:  # the RL buffer keeps states
        buffer = ReplayBuffer.from_lerobot_dataset(
            dataset, device="cpu", state_keys=["observation.state"], use_drq=False
        )
        arrays["buffer.next_state"] = buffer.next_states["observation.state"][: len(buffer)].numpy()
        arrays["buffer.done"] = buffer.dones[: len(buffer)].numpy()
        arrays["buffer.reward"] = buffer.rewards[: len(buffer)].numpy()
    np.savez(out_path, **arrays)


if __name__ == "__main__":
    command, *arguments = sys.argv[1:]
    {"write": write, "read": read}[command](*arguments)
