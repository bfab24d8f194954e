"""Pictures of an env's copies, for episode videos: those the env already makes for the
operator console. LIBERO's cameras of its last observation (agent view and wrist side
by side), a real arm's cameras (side by side), the built-in env's top-down render; an
env with none of these (a state-only LIBERO run, arms without cameras) gives none.
Copies stepped by env workers are pictured by their worker."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

Pictures = Callable[[list[int]], np.ndarray]  # copies → [n, H, W, 3] uint8

PICTURING = ("camera_frames", "render_copies", "pictures_from_workers")


def pictures_of(env: object, size: int) -> Pictures | None:
    """How to picture copies of `env` (or of the env it wraps); None when it has no
    picture to give. Copies stepped by env workers are pictured by their worker."""
    inner = env
    while not any(hasattr(inner, way) for way in PICTURING):
        inner = getattr(inner, "env", None)
        if inner is None:
            return None
    if not list(getattr(inner, "camera_names", [None])):  # cameras named, and none there
        return None
    if hasattr(inner, "pictures_from_workers"):
        if inner.pictures_from_workers([0], size) is None:  # the workers' env has none
            return None
        return lambda copies: inner.pictures_from_workers(copies, size)
    if hasattr(inner, "camera_frames"):

        def cameras(copies: list[int]) -> np.ndarray:
            frames = [inner.camera_frames(copy) for copy in copies]
            return np.stack([np.concatenate(list(f.values()), axis=1) for f in frames])

        return cameras
    return lambda copies: inner.render_copies(torch.tensor(copies, device="cpu"), size).numpy()


def picture_copies(env: object, copies: list[int], size: int) -> np.ndarray | None:
    """Pictures of `copies` of `env`, as `pictures_of` makes them: what an env worker
    answers for the copies it steps; None when its env has none."""
    pictures = pictures_of(env, size)
    return None if pictures is None else pictures(copies)
