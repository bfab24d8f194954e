"""The trainer's end of the operator console: operators' commands from the run's link
go to the run's `TeleopSource` (which keeps every safety rule), and the robots' state,
camera frames, replies and applied commands go back as live `console` messages several
times a second. Each takeover that ends is sent as a stored `takeover` event, for the
audit (trainer.link.console_messages has both message kinds).

A command's server stamp becomes the source's clock's time here (`ServerClock`), and a
robot's driver is sent only the action the source decided on (`operator_action`:
validated and clamped), never the message's own numbers. Times that leave the trainer
(`applied`, the audit) are wall-clock times.
"""

from __future__ import annotations

import base64
import io
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from trainer.envs.teleop import TeleopRefused, TeleopSource, operator_action
from trainer.link.console_messages import (
    Applied,
    Console,
    Frame,
    InvalidConsoleMessage,
    Reply,
    RobotState,
    Segment,
    Teleop,
    parse_teleop,
)
from trainer.link.environment import Link
from trainer.robots.driver import RobotDriver
from trainer.robots.server_clock import ServerClock

log = logging.getLogger(__name__)

FRAMES_PER_S = 15.0
WATCH_S = 3.0  # a console asks for a robot's frames again within this (op "watch")
MAX_FRAMES = 4  # frames per message
JPEG_QUALITY = 80
FRAME_SLACK = 0.25  # of a camera period
# Replies that change what the console shows are sent at once, not at the next tick.
PUBLISH_AT_ONCE = {"take_over", "release", "estop", "clear_stop", "mark", "link_lost"}


class ConsoleBridge:
    def __init__(
        self,
        link: Link,
        source: TeleopSource,
        robots: Sequence[RobotDriver],
        task_name: Callable[[], str] = str,
        frames_per_s: float = FRAMES_PER_S,
        camera_fps: float = FRAMES_PER_S,
        jpeg_quality: int = JPEG_QUALITY,
        first_robot: int = 0,
        total_robots: int | None = None,
        audit: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        """`frames_per_s`: how often the robots' state is sent; `camera_fps` and
        `jpeg_quality`: the camera frames', encoded only for robots someone watches or
        holds, and only the cameras their consoles show.

        A placed process steps a slice of the run's robots: `first_robot` is the run's
        number of its first (consoles number robots across the run) and `total_robots`
        how many the run has. Commands reach every such process; each carries out those
        for its own robots, and the one with robot 0 refuses a robot no process has.
        `audit` stores an ended takeover (by default an event on `link`)."""
        if len(robots) != source.num_envs:
            raise ValueError(f"{len(robots)} robots for {source.num_envs} env copies")
        self.link, self.source, self.robots = link, source, list(robots)
        self.first_robot = first_robot
        self.total_robots = len(self.robots) if total_robots is None else total_robots
        self.audit = audit or link.event
        self.task_name, self.period = task_name, 1.0 / frames_per_s
        self._lock = threading.Lock()
        self._publishing = threading.Lock()
        self._replies: list[Reply] = []
        self._applied: list[Applied] = []
        self._watched: dict[int, float] = {}  # robot → watched until
        self._shown: dict[tuple[int, str], float] = {}  # (robot, camera) → shown until
        self.camera_period, self.jpeg_quality = 1.0 / camera_fps, jpeg_quality
        self._frames_due = 0.0  # time.monotonic of the next frames
        self._audited = 0  # takeovers already sent as events
        self._stops_audited = 0  # e-stops pressed and cleared already sent as events
        self.server_clock = ServerClock()
        for robot in self.robots:
            robot.connect()
        source.on_applied = self._on_applied
        link.on_command(self.handle)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="console-bridge", daemon=True)
        self._thread.start()

    # ----- commands (the link's thread) -------------------------------------------------
    def handle(self, data: dict[str, Any]) -> None:
        arrival = self.source.clock()  # first: the command's wait here counts in its age
        try:
            message = parse_teleop(data)
        except InvalidConsoleMessage as error:
            operator, op = str(data.get("operator", ""))[:150], str(data.get("op"))[:20]
            self._reply(Reply(operator=operator, op=op, ok=False, error=str(error)[:500]))
            return
        if message.robot is not None and not self._mine(message.robot):
            return  # another process's robot: it answers
        sent_at = None
        if message.sent_at is not None:  # every stamp is a pair for the clock's estimate
            sent_at = self.server_clock.local_time(message.sent_at, arrival, message.clock)
        try:
            self._carry_out(message, sent_at)
        except TeleopRefused as refused:
            self._reply(Reply(operator=message.operator, id=message.id, op=message.op, ok=False,
                              error=str(refused)[:500]))  # fmt: skip
        else:
            if message.op not in ("command", "heartbeat", "watch"):
                self._reply(Reply(operator=message.operator, id=message.id, op=message.op,
                                  ok=True))  # fmt: skip
        if message.op in PUBLISH_AT_ONCE:
            self.publish()

    def _carry_out(self, message: Teleop, sent_at: float | None) -> None:
        """`sent_at`: when the command was sent, in the source's clock."""
        op, operator = message.op, message.operator
        if op == "link_lost":
            self.source.link_lost(operator)
            return
        if message.robot is None:
            raise TeleopRefused(f"{op} needs a robot")
        robot = message.robot - self.first_robot  # this process's copy
        if not 0 <= robot < len(self.robots):
            raise TeleopRefused(
                f"there is no robot {message.robot}: robots are 0..{self.total_robots - 1}"
            )
        if op in ("take_over", "watch"):
            with self._lock:
                until = time.monotonic() + WATCH_S
                self._watched[robot] = until
                if message.camera is not None:
                    if message.camera not in self.robots[robot].camera_names():
                        raise TeleopRefused(f"robot {robot} has no camera {message.camera!r}")
                    self._shown[(robot, message.camera)] = until
        if op == "take_over":
            self.source.take_over(robot, operator)
        elif op == "release":
            self.source.release(robot, operator)
        elif op == "heartbeat":
            self.source.heartbeat(robot, operator)
        elif op == "command":
            if message.action is None:
                raise TeleopRefused("a command needs an action")
            if sent_at is None:
                raise TeleopRefused("a command needs the server's sent_at")
            wanted = self._env_gripper(robot, message.action)
            action = self.source.command(robot, operator, wanted, sent_at, message.id)
            if action is not None:  # the validated, clamped action; None: superseded
                self.robots[robot].send_action(action)
        elif op == "estop":
            self.source.estop(robot, operator)
            self.robots[robot].stop()
        elif op == "clear_stop":
            self.source.clear_stop(robot, operator, override=message.override)
        elif op == "mark":
            if message.success is None:
                raise TeleopRefused("a mark needs success: true or false")
            self.source.mark(robot, operator, message.success)

    def _env_gripper(self, robot: int, action: list[float]) -> list[float]:
        """`action` with its gripper in the robot's env's convention: a console sends
        the gripper's wanted state (> 0 closed, < 0 open, 0 as it is), which the robot's
        driver turns into its own command (SERL's arms close at -1). Checked first
        (`operator_action`), so a refused action stays refused."""
        gripper = self.source.gripper_dim
        values = operator_action(action, self.source.action_dim).tolist()
        if gripper is not None and values[gripper] != 0:
            values[gripper] = self.robots[robot].gripper_action(values[gripper] > 0)
        return values

    def _mine(self, robot: int) -> bool:
        """Whether this process answers for `robot` (numbered across the run): its own,
        and, in the process with robot 0, one no process has."""
        if self.first_robot <= robot < self.first_robot + len(self.robots):
            return True
        return self.first_robot == 0 and robot >= self.total_robots

    def _reply(self, reply: Reply) -> None:
        with self._lock:
            self._replies.append(reply)

    def _on_applied(self, command_id: str, at: float) -> None:
        with self._lock:
            self._applied.append(Applied(id=command_id, at=self._wall(at)))

    def _wall(self, at: float) -> float:
        """A time of the source's clock as a wall-clock time (for the audit, the page)."""
        return time.time() - (self.source.clock() - at)

    # ----- state out (the bridge's thread) ----------------------------------------------
    def _run(self) -> None:
        # Paced by deadlines, not by a wait after each publication: the time a
        # publication takes (encoding frames) must not slow the rate below the one asked.
        next_at = time.monotonic()
        while True:
            next_at += self.period
            if self._stop.wait(max(0.0, next_at - time.monotonic())):
                return
            try:
                self.publish()
            except Exception:  # the console must never stop training
                log.exception("console: could not publish the robots' state")
            next_at = max(next_at, time.monotonic() - self.period)  # behind: no burst

    def publish(self) -> None:
        with self._publishing:  # from the link's thread and this one
            self._publish()

    def _publish(self) -> None:
        now = time.monotonic()
        with self._lock:
            replies, self._replies = self._replies[-64:], []
            applied, self._applied = self._applied[-256:], []
            watched = [robot for robot, until in self._watched.items() if until > now]
            shown = [key for key, until in self._shown.items() if until > now]
        statuses = self.source.status()
        held = [status.copy for status in statuses if status.mode != "policy"]
        frames = []
        framed = list(dict.fromkeys(held + watched))[:MAX_FRAMES]
        # Frames every camera period, kept on schedule (a tick a little early still
        # counts) without bursting after a stall.
        if framed and now >= self._frames_due - FRAME_SLACK * self.camera_period:
            self._frames_due = max(
                self._frames_due + self.camera_period,
                now + (1 - FRAME_SLACK) * self.camera_period,
            )
            for robot in framed:
                frames += self._frames(robot, [camera for r, camera in shown if r == robot])
        robots = [
            RobotState(
                robot=self.first_robot + status.copy,
                name=self.robots[status.copy].name,
                mode=status.mode,
                holder=status.holder,
                episode=status.episode,
                episode_step=status.episode_step,
                policy_action=status.policy_action,
                last_success=status.last_success,
                state=self.robots[status.copy].read_state(),
                gripper_closed=self.robots[status.copy].gripper_closed(),
                cameras=self.robots[status.copy].camera_names()[:16],
                timeline=[Segment(who=who, steps=steps) for who, steps in status.timeline],
            )  # fmt: skip
            for status in statuses
        ]
        message = Console(
            time=time.time(), task=self.task_name()[:300],
            control_hz=self.source.settings.control_hz, robots=robots, frames=frames,
            replies=replies, applied=applied,
        )  # fmt: skip
        self.link.live(message.model_dump(mode="json"))
        self._audit()

    def _frames(self, robot: int, shown: list[str]) -> list[Frame]:
        """The frames of the cameras consoles show (none chosen: the robot's first)."""
        from PIL import Image  # only where a console watches a camera

        names = shown or self.robots[robot].camera_names()[:1]
        frames = []
        for camera, pixels in self.robots[robot].read_cameras(names).items():
            buffer = io.BytesIO()
            Image.fromarray(pixels).save(buffer, format="JPEG", quality=self.jpeg_quality)
            frames.append(
                Frame(
                    robot=self.first_robot + robot,
                    camera=camera,
                    jpeg=base64.b64encode(buffer.getvalue()).decode(),
                    width=pixels.shape[1],
                    height=pixels.shape[0],
                )  # fmt: skip
            )
        return frames

    def _audit(self) -> None:
        """Each takeover that ended, and each e-stop pressed or cleared, since the last
        call, as a stored event."""
        finished = self.source.takeovers[self._audited :]
        self._audited += len(finished)
        for takeover in finished:
            ended = takeover.ended
            self.audit(
                "takeover",
                {
                    "operator": takeover.operator, "robot": self.first_robot + takeover.copy,
                    "robot_name": self.robots[takeover.copy].name,
                    "started": self._wall(takeover.started),
                    "ended": time.time() if ended is None else self._wall(ended),
                    "steps": takeover.steps,
                    "reason": takeover.reason or "",
                },
            )  # fmt: skip
        stops = self.source.stops[self._stops_audited :]
        self._stops_audited += len(stops)
        for stop in stops:
            self.audit("estop", {
                "action": stop.action, "operator": stop.operator,
                "robot": self.first_robot + stop.copy, "robot_name": self.robots[stop.copy].name,
                "at": self._wall(stop.at), "stopped_by": stop.stopped_by,
                "override": stop.override,
            })  # fmt: skip

    def close(self) -> None:
        """Stop publishing; takeovers still held are ended ("run ended") and audited."""
        self._stop.set()
        self._thread.join(timeout=2)
        self.link.on_command(None)
        self.source.end_all("run ended")
        with self._publishing:
            self._audit()
        for robot in self.robots:
            robot.close()
