"""What a rollout round records for videos: the pictures of a few of its copies at each
decision, who acted at each step and the rewards, until each copy's episode ends.

Pictures are those the env already makes for the operator console: LIBERO's cameras
of its last observation (agent view and wrist side by side), else the env's top-down
render (the built-in env); an env with neither records nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from trainer.envs.vector_env import EnvStep
from trainer.videos.recorder import EpisodeClip

Pictures = Callable[[list[int]], np.ndarray]  # copies → [n, H, W, 3] uint8


def pictures_of(env: object, size: int) -> Pictures | None:
    """How to picture copies of `env` (or of the env it wraps); None when it has no
    picture to give."""
    inner = env
    while not hasattr(inner, "camera_frames") and not hasattr(inner, "render_copies"):
        inner = getattr(inner, "env", None)
        if inner is None:
            return None
    if hasattr(inner, "camera_frames"):
        if not list(getattr(inner, "camera_names", [])):  # a state-only LIBERO run
            return None

        def cameras(copies: list[int]) -> np.ndarray:
            frames = [inner.camera_frames(copy) for copy in copies]
            return np.stack([np.concatenate(list(f.values()), axis=1) for f in frames])

        return cameras
    return lambda copies: inner.render_copies(torch.tensor(copies, device="cpu"), size).numpy()


class RoundCapture:
    """Records copies `copies` of one round (`start` after the reset, `step` after
    each env step); `clips` gives their episodes once the round is over."""

    def __init__(self, pictures: Pictures, copies: list[int], task: int,
                 info: list[dict[str, Any]], name: Callable[[int], str]) -> None:  # fmt: skip
        """`info`: what each copy's record says besides (init state, horizon, ...);
        `name(copy)`: its episode's file stem."""
        self.pictures, self.copies, self.task, self.info, self.name = (
            pictures, copies, task, info, name,
        )  # fmt: skip
        self.frames: list[list[np.ndarray]] = [[] for _ in copies]
        self.actors: list[list[str]] = [[] for _ in copies]
        self.rewards: list[list[float]] = [[] for _ in copies]
        self.success = [False] * len(copies)
        self.running = [True] * len(copies)

    def start(self) -> None:
        for frames, picture in zip(self.frames, self.pictures(self.copies), strict=True):
            frames.append(picture)

    def step(self, step: EnvStep) -> None:
        picked = torch.tensor(self.copies, device="cpu")  # the env's step tensors live there
        done = step.done[picked].tolist()
        success = step.success[picked].tolist()
        reward = step.reward[picked].tolist()
        human = step.intervened[picked].tolist() if step.intervened is not None else None
        held = step.held[picked].tolist() if step.held is not None else None
        going = [i for i, running in enumerate(self.running) if running and not done[i]]
        # A copy whose episode ended was reset by the env: its picture now is the next
        # episode's, so its last picture is the one before.
        pictures = self.pictures([self.copies[i] for i in going]) if going else []
        shown = dict(zip(going, pictures, strict=True))
        for i, running in enumerate(self.running):
            if not running:
                continue
            actor = "human" if human and human[i] else "held" if held and held[i] else "policy"
            self.actors[i].append(actor)
            self.rewards[i].append(float(reward[i]))
            self.success[i] = self.success[i] or bool(success[i])
            if done[i]:
                self.running[i] = False
            else:
                self.frames[i].append(shown[i])

    def clips(self, count: int) -> list[EpisodeClip]:
        """Up to `count` of the recorded episodes, successes and failures in turn while
        both are left (a rollout's failures are what people look for)."""
        ended = [i for i in range(len(self.copies)) if self.actors[i]]
        wins = [i for i in ended if self.success[i]]
        losses = [i for i in ended if not self.success[i]]
        chosen: list[int] = []
        while len(chosen) < count and (wins or losses):
            for side in (losses, wins):
                if side and len(chosen) < count:
                    chosen.append(side.pop(0))
        return [
            EpisodeClip(self.name(self.copies[i]), self.task, np.stack(self.frames[i]),
                        self.actors[i], self.rewards[i], self.success[i], self.info[i])
            for i in sorted(chosen)
        ]  # fmt: skip
