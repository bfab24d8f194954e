"""A robot's driver gets only the action the teleop source decided on (validated and
clamped, the same the env applies), whatever numbers an operator's message carried."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import pytest
import torch

from trainer.envs.builtin_reach import BuiltinReachEnv
from trainer.envs.intervention import InterventionEnv
from trainer.envs.teleop import TeleopSettings, TeleopSource
from trainer.link.environment import NullLink
from trainer.robots.console_bridge import ConsoleBridge
from trainer.robots.driver import SimulatedRobot

SERVER_CLOCK = "web-1"


class RecordingRobot(SimulatedRobot):
    """A simulated robot that keeps every action it was sent, as sent."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[list[float]] = []

    def send_action(self, action: Sequence[float]) -> None:
        self.sent.append(list(action))
        super().send_action(action)


class RecordingLink(NullLink):
    """The run's link, keeping what the bridge sends the console."""

    def __init__(self) -> None:
        self.frames: list[dict] = []

    def live(self, payload: dict) -> None:
        self.frames.append(payload)


@pytest.fixture
def scene():
    core = BuiltinReachEnv(1, seed=0)
    source = TeleopSource(1, 7, TeleopSettings(deadman_s=5.0))
    env = InterventionEnv(core, source)
    env.reset(0, env.init_states(0)[:1])
    robot = RecordingRobot(core, 0, "sim-0")
    link = RecordingLink()
    bridge = ConsoleBridge(link, source, [robot], frames_per_s=1.0)
    bridge.handle(teleop("take_over"))
    yield env, robot, link, bridge
    bridge.close()


def teleop(op: str, **fields) -> dict:
    """A command as the link delivers it, stamped by the server just now."""
    return {"type": "teleop", "op": op, "operator": "olga", "robot": 0,
            "sent_at": time.monotonic(), "clock": SERVER_CLOCK, **fields}  # fmt: skip


def replies(link: RecordingLink, bridge: ConsoleBridge, op: str) -> list[dict]:
    bridge.publish()
    return [r for frame in link.frames for r in frame["replies"] if r["op"] == op]


@pytest.mark.parametrize(
    "action, clamped",
    [
        ([1e30, -1e30, 0.5, -2.0, 0.0, 0.0, 1.0], [1.0, -1.0, 0.5, -1.0, 0.0, 0.0, 1.0]),
        ([1e39, -1e300, 0.0, 0.0, 0.0, 0.0, 0.0], [1.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0]),
    ],
)
def test_the_driver_gets_the_clamped_action_the_env_applies(scene, action, clamped):
    env, robot, _, bridge = scene
    bridge.handle(teleop("command", action=action, id="c1"))
    assert robot.sent == [clamped]
    assert env.step(torch.zeros(1, 7)).applied_actions[0].tolist() == clamped


@pytest.mark.parametrize(
    "action, error",
    [
        ([float("nan")] * 7, "Input should be a finite number"),
        ([0.1, float("inf"), 0, 0, 0, 0, 0], "Input should be a finite number"),
        ([-float("inf")] + [0.0] * 6, "Input should be a finite number"),
        ([0.1, 0.2, 0.3], "an action is 7 finite numbers, not [3]"),
        ([0.1] * 8, "an action is 7 finite numbers, not [8]"),
    ],
)
def test_an_action_that_is_not_seven_finite_numbers_never_reaches_the_driver(scene, action, error):
    env, robot, link, bridge = scene
    bridge.handle(teleop("command", action=action, id="bad"))
    assert robot.sent == []
    (reply,) = replies(link, bridge, "command")
    assert not reply["ok"] and error in reply["error"]
    assert env.step(torch.zeros(1, 7)).applied_actions[0].tolist() == [0.0] * 7  # held still


def test_a_command_superseded_by_a_newer_one_is_not_sent_to_the_driver(scene):
    _, robot, _, bridge = scene
    late = teleop("command", action=[0.9] * 7, id="late")
    bridge.handle(teleop("command", action=[0.2] * 7, id="new"))
    bridge.handle(late)  # stamped before "new", arrived after it
    assert robot.sent == [pytest.approx([0.2] * 7)]


class TwoCameras(SimulatedRobot):
    """A robot with a scene camera and a wrist camera, counting the frames read."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.read: list[str] = []

    def camera_names(self) -> list[str]:
        return ["scene", "wrist"]

    def read_cameras(self, names=None) -> dict:
        chosen = [name for name in self.camera_names() if names is None or name in names]
        self.read += chosen
        return {name: np.full((24, 32, 3), 40 * (1 + index), dtype=np.uint8)
                for index, name in enumerate(chosen)}  # fmt: skip


def test_frames_are_the_chosen_cameras_at_their_own_rate_and_quality():
    core = BuiltinReachEnv(1, seed=0)
    source = TeleopSource(1, 7, TeleopSettings(deadman_s=5.0))
    robot, link = TwoCameras(core, 0, "arm-0"), RecordingLink()
    bridge = ConsoleBridge(link, source, [robot], frames_per_s=0.01, camera_fps=0.5,
                           jpeg_quality=30)  # fmt: skip
    try:
        bridge.publish()  # nobody watches: no frame is read or encoded
        assert link.frames[-1]["frames"] == [] and robot.read == []
        assert link.frames[-1]["robots"][0]["cameras"] == ["scene", "wrist"]
        bridge.handle(teleop("watch"))  # no camera named: the first
        bridge.publish()
        assert [f["camera"] for f in link.frames[-1]["frames"]] == ["scene"]
        bridge.publish()  # within the camera period: state only
        assert link.frames[-1]["frames"] == []
        bridge._frames_due = 0.0
        bridge.handle(teleop("watch", camera="wrist"))
        bridge.publish()
        (frame,) = link.frames[-1]["frames"]
        assert (frame["camera"], frame["width"], frame["height"]) == ("wrist", 32, 24)
        assert robot.read == ["scene", "wrist"]  # only what was shown was read
        sizes = {}
        for quality in (30, 90):
            bridge.jpeg_quality, bridge._frames_due = quality, 0.0
            bridge.publish()
            sizes[quality] = len(link.frames[-1]["frames"][0]["jpeg"])
        assert sizes[30] <= sizes[90]
        bridge.handle(teleop("watch", camera="thermal"))
        assert replies(link, bridge, "watch")[-1]["error"] == "robot 0 has no camera 'thermal'"
    finally:
        bridge.close()


def sliced_bridge(first: int, total: int, audits: list) -> tuple[ConsoleBridge, RecordingLink]:
    """The bridge of a placed process stepping robots `first`, `first + 1` of the run's
    `total` (two built-in copies)."""
    core = BuiltinReachEnv(2, seed=0)
    source = TeleopSource(2, 7, TeleopSettings(deadman_s=5.0))
    env = InterventionEnv(core, source)
    env.reset(0, env.init_states(0)[:2])
    robots = [RecordingRobot(core, copy, f"sim-{first + copy}") for copy in range(2)]
    link = RecordingLink()
    bridge = ConsoleBridge(
        link, source, robots, frames_per_s=1.0, first_robot=first, total_robots=total,
        audit=lambda *event: audits.append(event),
    )  # fmt: skip
    return bridge, link


def test_a_placed_process_answers_for_its_own_robots_in_the_runs_numbering():
    audits: list = []
    bridge, link = sliced_bridge(2, 4, audits)
    try:
        for robot in (0, 1, 7):  # another process's robots, or one no process has
            bridge.handle(teleop("take_over", robot=robot, id=f"t{robot}"))
        assert replies(link, bridge, "take_over") == []  # the others answer for those
        assert [status.mode for status in bridge.source.status()] == ["policy", "policy"]

        bridge.handle(teleop("take_over", robot=3, id="t3"))
        (reply,) = replies(link, bridge, "take_over")
        assert reply["ok"] and reply["id"] == "t3"
        assert [status.mode for status in bridge.source.status()] == ["policy", "human"]
        bridge.handle(teleop("command", robot=3, action=[0.5] + [0.0] * 6, id="c1"))
        assert bridge.robots[1].sent == [[0.5] + [0.0] * 6]
        state = link.frames[-1]["robots"]
        assert [(r["robot"], r["name"], r["mode"]) for r in state] == [
            (2, "sim-2", "policy"), (3, "sim-3", "human")]  # fmt: skip

        bridge.handle(teleop("release", robot=3))
        bridge.publish()
        ((kind, takeover),) = audits  # to the run's link by the driver, not this link
        assert kind == "takeover" and takeover["robot"] == 3
        assert takeover["robot_name"] == "sim-3" and takeover["operator"] == "olga"
    finally:
        bridge.close()


def test_the_process_with_robot_0_refuses_a_robot_no_process_has():
    bridge, link = sliced_bridge(0, 4, [])
    try:
        bridge.handle(teleop("take_over", robot=3))  # process 2's: not answered here
        bridge.handle(teleop("take_over", robot=4, id="t4"))
        (reply,) = replies(link, bridge, "take_over")
        assert not reply["ok"] and reply["error"] == "there is no robot 4: robots are 0..3"
    finally:
        bridge.close()


GRIP = 6  # every console env's gripper: the action's last number


def held_gripper_scene() -> tuple[InterventionEnv, BuiltinReachEnv, ConsoleBridge, RecordingLink]:
    """The simulated robot's gripper closed by the policy, then taken over."""
    core = BuiltinReachEnv(1, seed=0)
    source = TeleopSource(1, 7, TeleopSettings(deadman_s=5.0), gripper_dim=GRIP)
    env = InterventionEnv(core, source)
    env.reset(0, env.init_states(0)[:1])
    closing = torch.zeros(1, 7)
    closing[0, GRIP] = 1.0
    env.step(closing)  # the policy closes the gripper: it holds something
    link = RecordingLink()
    bridge = ConsoleBridge(link, source, [SimulatedRobot(core, 0, "sim-0")], frames_per_s=1.0)
    bridge.handle(teleop("take_over"))
    return env, core, bridge, link


def gripper_closed(core: BuiltinReachEnv) -> bool:
    return core.copy_state(0)["gripper"] == [1.0]


def test_taking_over_a_closed_gripper_keeps_it_closed_until_the_operator_opens_it():
    env, core, bridge, link = held_gripper_scene()
    try:
        bridge.publish()
        assert link.frames[-1]["robots"][0]["gripper_closed"] is True  # what a page starts from
        env.step(torch.zeros(1, 7))  # held still before the first command: zero motion
        assert gripper_closed(core)
        # A console that started from "open" sends -1 with every command: the start of the
        # takeover, not the operator's command. The effector moves; the gripper stays.
        for _ in range(3):
            bridge.handle(teleop("command", action=[1.0, 0, 0, 0, 0, 0, -1.0]))
            applied = env.step(torch.zeros(1, 7)).applied_actions[0]
            assert applied[0] == 1.0 and applied[GRIP] == 0.0
            assert gripper_closed(core)
        # The operator's own change: closed (as it is), then open.
        bridge.handle(teleop("command", action=[0, 0, 0, 0, 0, 0, 1.0]))
        env.step(torch.zeros(1, 7))
        assert gripper_closed(core)
        bridge.handle(teleop("command", action=[0, 0, 0, 0, 0, 0, -1.0]))
        env.step(torch.zeros(1, 7))
        assert not gripper_closed(core)
    finally:
        bridge.close()


def test_a_console_that_sends_the_gripper_as_it_is_moves_it_on_the_first_change():
    env, core, bridge, _ = held_gripper_scene()
    try:
        bridge.handle(teleop("command", action=[0.0] * 7))  # untouched: 0
        env.step(torch.zeros(1, 7))
        assert gripper_closed(core)
        bridge.handle(teleop("command", action=[0, 0, 0, 0, 0, 0, -1.0]))  # G: open
        env.step(torch.zeros(1, 7))
        assert not gripper_closed(core)
    finally:
        bridge.close()
