"""What a rollout round records for videos: the pictures of a few of its copies at each
decision (trainer.envs.pictures), who acted at each step and the rewards, until each
copy's episode ends."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from trainer.envs.pictures import Pictures
from trainer.envs.vector_env import EnvStep
from trainer.videos.recorder import EpisodeClip

# The step bar's colours (app.css): a picture at which the operator acted, or the arm
# was held, gets a border of that colour, so the video itself shows who acted when.
BORDERS = {"human": (224, 138, 30), "held": (154, 161, 173)}


def mark_actors(frames: np.ndarray, actors: list[str]) -> np.ndarray:
    """`frames` ([T, H, W, 3], one per step) with a border on those whose step was not
    the policy's."""
    marked = frames.copy()
    width = max(2, frames.shape[1] // 32)
    for frame, actor in zip(marked, actors, strict=False):
        colour = BORDERS.get(actor)
        if colour is not None:
            for edge in (frame[:width], frame[-width:], frame[:, :width], frame[:, -width:]):
                edge[...] = colour
    return marked


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
        self._clear()

    def _clear(self) -> None:
        """Nothing recorded (a round redone after an env worker failed starts again)."""
        count = len(self.copies)
        self.frames: list[list[np.ndarray]] = [[] for _ in range(count)]
        self.actors: list[list[str]] = [[] for _ in range(count)]
        self.rewards: list[list[float]] = [[] for _ in range(count)]
        self.success = [False] * count
        self.running = [True] * count

    def start(self) -> None:
        self._clear()
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
        """Up to `count` of the recorded episodes, failures and successes in turn while
        both are left (a rollout's failures are what people look for), those in which
        an operator acted first (the rarest, and what a console's user comes back to)."""
        ended = [i for i in range(len(self.copies)) if self.actors[i]]
        ended.sort(key=lambda i: "human" not in self.actors[i])  # stable
        wins = [i for i in ended if self.success[i]]
        losses = [i for i in ended if not self.success[i]]
        chosen: list[int] = []
        while len(chosen) < count and (wins or losses):
            for side in (losses, wins):
                if side and len(chosen) < count:
                    chosen.append(side.pop(0))
        return [
            EpisodeClip(self.name(self.copies[i]), self.task,
                        mark_actors(np.stack(self.frames[i]), self.actors[i]),
                        self.actors[i], self.rewards[i], self.success[i], self.info[i])
            for i in sorted(chosen)
        ]  # fmt: skip
