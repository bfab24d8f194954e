"""A real arm behind SERL's robot server: the `RobotDriver` for the Flask server SERL and
HIL-SERL run on a Franka's real-time PC (serl_robot_infra/robot_servers/franka_server.py).

The server speaks JSON over HTTP POST: `getstate` (pose as xyz + quaternion xyzw, vel,
force, torque, q, dq, jacobian, gripper_pos), `pose` (`{"arr": [x, y, z, qx, qy, qz,
qw]}`, the impedance controller's next target), `clearerr`, `jointreset`,
`open_gripper`, `close_gripper`, `move_gripper` (`{"gripper_pos": 0-255}`) and
`update_param`. Actions are HIL-SERL's (franka_env.py): seven numbers in [-1, 1], a
translation (scaled by `action_scale[0]`, metres), a rotation as xyz Euler angles
(scaled by `action_scale[1]`, radians, applied before the current orientation) and the
gripper (`action_scale[2]`: at or below -0.5 closes an open gripper, at or above 0.5
opens a closed one). The next pose is the measured pose moved by the action, clipped to
the safety box, and sent once per control period (`control_hz`).

Every request has a deadline (`timeout_s`, and as long again for the answer's body). A
server that does not answer in time, or refuses, is a lost link: the driver raises
`RobotLinkLost` naming the server's host and the endpoint, and sends nothing more until
`connect` reaches the server again, so a silent server can never hang a step, and a
stale target is never sent after a gap.

The server's URL is an http(s) base the endpoints are joined onto (no query or
fragment: trainer.config.addresses); a redirect is never followed and an answer is read
up to `MAX_ANSWER_BYTES` (trainer.hardware.bounded_http). A port nobody listens on and
a silent host read the same ("did not answer"), and a password in the URL is sent as
basic auth and never written into a message.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.spatial.transform import Rotation

from trainer.config.addresses import check_robot_url, endpoint_url, url_host
from trainer.hardware.bounded_http import (
    MIB,
    NoAnswer,
    RefusedAnswer,
    open_session,
    read_body,
    send,
)

# SERL's franka_server.py listens on Flask's port, on the arm's real-time PC.
DEFAULT_PORT = 5000
# The most of an answer read: getstate's JSON (pose, forces, q, dq, a 6x7 jacobian) is a
# few KiB.
MAX_ANSWER_BYTES = MIB
STATE_KEYS = ("pose", "vel", "force", "torque", "q", "dq", "gripper_pos")
GRIPPER_OPEN = 0.85  # gripper_pos above this reads as open (HIL-SERL's threshold)


class RobotLinkLost(RuntimeError):
    """The robot server did not answer (in time, or at all)."""


@dataclass(frozen=True)
class SafetyBox:
    """Where the end effector may be sent: xyz in metres, and orientation as xyz Euler
    angles in radians. Roll bounds |roll|, as HIL-SERL's box does: a gripper pointing
    down sits near ±pi, where roll's sign flips."""

    xyz_low: tuple[float, float, float]
    xyz_high: tuple[float, float, float]
    rpy_low: tuple[float, float, float] = (0.0, -np.pi, -np.pi)
    rpy_high: tuple[float, float, float] = (np.pi, np.pi, np.pi)

    def __post_init__(self) -> None:
        for name, low, high in (("xyz", self.xyz_low, self.xyz_high),
                                ("rpy", self.rpy_low, self.rpy_high)):  # fmt: skip
            if (
                len(low) != 3
                or len(high) != 3
                or any(lo > hi for lo, hi in zip(low, high, strict=True))
            ):
                raise ValueError(f"safety box {name}: 3 lows each at most its high, got "
                                 f"{list(low)} and {list(high)}")  # fmt: skip

    def clip(self, pose: np.ndarray) -> np.ndarray:
        """`pose` ([x, y, z, qx, qy, qz, qw]) moved into the box."""
        clipped = np.array(pose, dtype=np.float64)
        clipped[:3] = np.clip(clipped[:3], self.xyz_low, self.xyz_high)
        euler = Rotation.from_quat(clipped[3:]).as_euler("xyz")
        sign = 1.0 if euler[0] >= 0 else -1.0
        euler[0] = sign * np.clip(abs(euler[0]), self.rpy_low[0], self.rpy_high[0])
        euler[1:] = np.clip(euler[1:], self.rpy_low[1:], self.rpy_high[1:])
        clipped[3:] = Rotation.from_euler("xyz", euler).as_quat()
        return clipped

    def holds(self, pose: Sequence[float], tolerance: float = 1e-6) -> bool:
        """Whether `pose` lies in the box (what a request log is checked against)."""
        inside = _same_sign(self.clip(np.asarray(pose)))
        return bool(np.allclose(inside, _same_sign(pose), atol=tolerance))


def _same_sign(pose: Sequence[float]) -> np.ndarray:
    """q and -q are one orientation: compare quaternions with w >= 0."""
    pose = np.array(pose, dtype=np.float64)
    if pose[6] < 0:
        pose[3:] = -pose[3:]
    return pose


@dataclass(frozen=True)
class SerlSettings:
    # e.g. http://172.16.0.2:5000/; out of repr (it may hold a password), as the cameras
    url: str = field(repr=False)
    safety_box: SafetyBox
    action_scale: tuple[float, float, float] = (0.01, 0.06, 1.0)
    control_hz: float = 10.0
    timeout_s: float = 0.5
    reset_pose: tuple[float, ...] | None = None  # xyz + quaternion; None: stay where it is
    joint_reset: bool = False  # /jointreset on every reset (slow; a Franka's home)
    cameras: dict[str, str] = field(default_factory=dict, repr=False)  # name -> its URL


class SerlFranka:
    """One arm behind a SERL robot server."""

    def __init__(self, name: str, settings: SerlSettings) -> None:
        try:
            check_robot_url(settings.url)
        except ValueError as error:
            raise ValueError(f"{name}: {error}") from None
        self.name, self.settings = name, settings
        self.session, self.url = open_session(settings.url)  # the URL without a password
        self.host = url_host(self.url)  # what messages name
        self.state: dict[str, Any] = {}
        self.lost: str | None = "not connected"
        self.last_action: list[float] = []
        self.next_step_at = 0.0  # the control rate's clock (time.monotonic)
        # The env steps the arm while the console may e-stop it: one request at a time.
        self._lock = threading.Lock()

    # ----- the server's endpoints --------------------------------------------------
    def _post(self, endpoint: str, payload: dict | None = None) -> bytes:
        """The body of the server's answer to `endpoint`."""
        if self.lost is not None and endpoint != "getstate":
            raise RobotLinkLost(f"{self.name}: link lost ({self.lost}); connect() first")
        timeout_s = self.settings.timeout_s
        try:
            with self._lock:
                response = send(
                    self.session, "POST", endpoint_url(self.url, endpoint), timeout_s, json=payload
                )
                return read_body(response, MAX_ANSWER_BYTES, timeout_s)
        except NoAnswer:
            self.lost = f"{endpoint}: no answer"
            raise RobotLinkLost(
                f"{self.name}: the robot server at {self.host} did not answer {endpoint} "
                f"within {timeout_s} s"
            ) from None
        except RefusedAnswer as error:
            self.lost = f"{endpoint}: {error}"
            raise RobotLinkLost(
                f"{self.name}: the robot server at {self.host} answered {endpoint} with {error}"
            ) from None

    def _read(self) -> dict[str, Any]:
        body = self._post("getstate")
        try:
            state = json.loads(body)
            pose = np.asarray(state["pose"], dtype=np.float64)
        except (ValueError, KeyError, TypeError, RecursionError) as error:
            self.lost = "getstate: not SERL's state"
            raise RobotLinkLost(
                f"{self.name}: the robot server at {self.host} answered getstate with no SERL "
                f"state ({type(error).__name__})"
            ) from None
        if pose.shape != (7,) or not np.isfinite(pose).all():
            self.lost = "getstate: bad pose"
            raise RobotLinkLost(
                f"{self.name}: getstate's pose is not 7 finite numbers (shape {pose.shape})"
            )
        self.state = state
        return state

    def _send_pose(self, pose: np.ndarray) -> None:
        self._post("pose", {"arr": self.settings.safety_box.clip(pose).tolist()})

    # ----- RobotDriver -----------------------------------------------------------------
    def connect(self) -> None:
        """Reach the server (again): one state read in time clears a lost link."""
        self._read()
        self.lost = None

    def read_state(self) -> dict[str, list[float]]:
        state = {key: np.ravel(self.state[key]).tolist() for key in STATE_KEYS if key in self.state}
        if self.last_action:
            state["action"] = self.last_action
        return state

    def camera_names(self) -> list[str]:
        return []  # the arm's cameras are URLs of their own (trainer.hardware.url_camera)

    def read_cameras(self, names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        return {}

    def send_action(self, action: Sequence[float]) -> None:
        """One control step: wait for the period's start, move the measured pose by the
        action, clip it to the box, send it, command the gripper, read the new state."""
        action = np.asarray(action, dtype=np.float64)
        if action.shape != (7,):
            raise ValueError(f"{self.name}: SERL actions are 7 numbers, not {action.shape}")
        self._pace()
        pose = np.asarray(self._current()["pose"], dtype=np.float64)
        scale = self.settings.action_scale
        target = pose.copy()
        target[:3] += action[:3] * scale[0]
        turn = Rotation.from_euler("xyz", action[3:6] * scale[1])
        target[3:] = (turn * Rotation.from_quat(pose[3:])).as_quat()
        self._send_pose(target)
        self._gripper(action[6] * scale[2])
        self.last_action = [round(float(v), 3) for v in action]
        self._read()

    def _current(self) -> dict[str, Any]:
        return self.state if self.state else self._read()

    def _gripper(self, command: float) -> None:
        opened = float(np.ravel(self.state.get("gripper_pos", [1.0]))[0]) > GRIPPER_OPEN
        if command <= -0.5 and opened:
            self._post("close_gripper")
        elif command >= 0.5 and not opened:
            self._post("open_gripper")

    def _pace(self) -> None:
        """Hold the control rate: each step starts one period after the last."""
        now = time.monotonic()
        if now < self.next_step_at:
            time.sleep(self.next_step_at - now)
            now = self.next_step_at
        self.next_step_at = now + 1.0 / self.settings.control_hz

    def stop(self) -> None:
        """Hold still: the measured pose becomes the target. With the link lost there is
        nothing to send; the server's controller holds its last target."""
        if self.lost is None:
            self._send_pose(np.asarray(self._read()["pose"], dtype=np.float64))

    def gripper_closed(self) -> bool | None:
        """As HIL-SERL reads it: closed at or below `GRIPPER_OPEN` (None: not read yet)."""
        position = self.state.get("gripper_pos")
        return None if position is None else float(np.ravel(position)[0]) <= GRIPPER_OPEN

    def gripper_action(self, closed: bool) -> float:
        """HIL-SERL's: at or below -0.5 closes, at or above 0.5 opens, 0 keeps."""
        return -1.0 if closed else 1.0

    def reset(self) -> None:
        """Clear the arm's errors, home its joints if configured, go to the reset pose
        with the gripper open."""
        self.connect()
        self._post("clearerr")
        if self.settings.joint_reset:
            self._post("jointreset")
        if self.settings.reset_pose is not None:
            self._send_pose(np.asarray(self.settings.reset_pose, dtype=np.float64))
        self._post("open_gripper")
        self._read()

    def close(self) -> None:
        self.session.close()
