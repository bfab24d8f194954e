"""The robot-driver interface, and the simulated robot that implements it.

A driver is what the rest of Armature knows of one robot: the operator console reads
its state and cameras through it, and e-stops it through it, the same way for a
simulated copy and for an arm. The shape is a Franka driver's (HIL-SERL's robot
servers): connect once, read joint/effector state and camera frames, send one action
per control step, stop (hold still, brakes on), close. A real arm's env (the
`VectorEnv` a run steps) calls `send_action` in its `step` and builds observations
from `read_state` and `read_cameras`; the simulated robot's env already owns its
physics, so there the driver is a view of one env copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np


class RobotDriver(Protocol):
    name: str

    def connect(self) -> None:
        """Open the connection (a Franka: its IP and camera serials from the inventory)."""
        ...

    def read_state(self) -> dict[str, list[float]]:
        """Named state vectors, e.g. ``{"effector": [x, y, z], "gripper": [closed]}``."""
        ...

    def camera_names(self) -> list[str]:
        """The robot's cameras, the first the one a console shows unless told."""
        ...

    def read_cameras(self, names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """The latest frame of each camera named (None: all), ``[H, W, 3]`` uint8 RGB."""
        ...

    def send_action(self, action: Sequence[float]) -> None:
        """One control step's action: 6-DoF end-effector delta and gripper.

        Every caller first passes the action through `trainer.envs.teleop.operator_action`,
        so it is exactly the env's `action_dim` finite floats, each in [-1, 1]: an
        operator's wrong-length, NaN or infinite action never gets here, and 1e30 arrives
        as 1.0. Today's one caller is the console bridge, which sends the action its
        teleop source will apply; a real arm's env, calling this in its `step`, must do
        the same with whatever it steps with (the policy's actions included). A driver
        scales it to its arm's own limits, which it still enforces."""
        ...

    def stop(self) -> None:
        """Hold still until the next action (e-stop, link loss with `stop`)."""
        ...

    def gripper_closed(self) -> bool | None:
        """Whether the gripper is closed, as measured (None: it has none, or unknown)."""
        ...

    def gripper_action(self, closed: bool) -> float:
        """The action's last component that closes (or opens) the gripper, in this
        robot's env's convention; 0 keeps it as it is, in every env."""
        ...

    def close(self) -> None: ...


class SimulatedRobot:
    """One copy of a simulated env as a robot. Its state is the env's `copy_state`;
    its cameras the images its last observation was made from where the env keeps them
    (`camera_frames`: LIBERO's agent-view and wrist cameras), else the env's top-down
    `render` where it has one (the built-in env)."""

    def __init__(self, env: object, copy: int, name: str, frame_size: int = 160) -> None:
        self.env, self.copy, self.name, self.frame_size = env, copy, name, frame_size
        self.last_action: list[float] = []
        self.stopped = False

    def connect(self) -> None:
        """Nothing to open: the env is in this process."""

    def read_state(self) -> dict[str, list[float]]:
        copy_state = getattr(self.env, "copy_state", None)
        state = copy_state(self.copy) if copy_state is not None else {}
        if self.last_action:
            state["action"] = self.last_action
        return state

    def camera_names(self) -> list[str]:
        if hasattr(self.env, "camera_frames"):  # LIBERO: the cameras it observes with
            return list(self.env.camera_names)
        return ["top"] if hasattr(self.env, "render") else []

    def read_cameras(self, names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        wanted = [name for name in self.camera_names() if names is None or name in names]
        if not wanted:
            return {}
        if hasattr(self.env, "camera_frames"):  # the frames of its last observation
            frames = self.env.camera_frames(self.copy)
            return {name: frames[name] for name in wanted if name in frames}
        return {"top": self.env.render(self.copy, self.frame_size).numpy()}

    def send_action(self, action: Sequence[float]) -> None:
        """Noted for `read_state`: the env applies its copies' actions in its own step
        (the same validated, clamped action: see `RobotDriver.send_action`)."""
        self.last_action = [round(float(v), 3) for v in action]
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True

    def gripper_closed(self) -> bool | None:
        copy_state = getattr(self.env, "copy_state", None)
        gripper = (copy_state(self.copy) if copy_state is not None else {}).get("gripper")
        return bool(gripper[0] > 0.5) if gripper else None

    def gripper_action(self, closed: bool) -> float:
        """The built-in env and LIBERO (robosuite): > 0 closes, < 0 opens."""
        return 1.0 if closed else -1.0

    def close(self) -> None:
        """Nothing to release."""
