"""Recorded episodes for tests, made by the trainer's own recorder from the built-in
env's pictures: each a real H.264 mp4 in the run's folder, and its record."""

from pathlib import Path

import numpy as np
import torch

from trainer.envs.builtin_reach import BuiltinReachEnv
from trainer.videos.recorder import EpisodeClip, EpisodeRecorder

STEPS = 20


def moving_frames(copies: int, size: int = 64, seed: int = 0) -> list[np.ndarray]:
    """`copies` episodes of the built-in env's picture under random actions."""
    env = BuiltinReachEnv(num_envs=copies, max_episode_steps=STEPS * 2, seed=seed)
    env.reset(0, env.init_states(0)[:copies])
    generator = torch.Generator().manual_seed(seed)
    frames = [env.render_copies(torch.arange(copies), size).numpy()]
    for _ in range(STEPS - 1):
        env.step(torch.rand(copies, env.action_dim, generator=generator) * 2 - 1)
        frames.append(env.render_copies(torch.arange(copies), size).numpy())
    return list(np.stack(frames, axis=1))


def record_episodes(folder: Path, specs: list[dict]) -> list[dict]:
    """One episode per spec ({"name", "task", "success", "human": (first, last) steps
    an operator acted, "iteration", "horizon"}); their records, as the link sends them."""
    records: list[dict] = []
    recorder = EpisodeRecorder(folder, fps=10, on_episode=records.append)
    for spec, frames in zip(specs, moving_frames(len(specs)), strict=True):
        first, last = spec.get("human", (STEPS, STEPS))
        actors = ["human" if first <= step <= last else "policy" for step in range(STEPS)]
        rewards = [0.0] * (STEPS - 1) + [1.0 if spec["success"] else 0.0]
        info = {
            "task_name": f"reach_{spec['task']}", "init_state": spec.get("init_state", 0),
            "horizon": spec.get("horizon", 5), "iteration": spec.get("iteration", 1),
        }  # fmt: skip
        recorder.submit(EpisodeClip(spec["name"], spec["task"], frames, actors, rewards,
                                    spec["success"], info))  # fmt: skip
    recorder.close()
    return records
