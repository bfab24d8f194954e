"""What the console's end-to-end tests are made of: simulated robots behind the run's
real trainer link (stepped in a thread, every step recorded), operators' console sockets
on a live daphne, and logged-in sessions."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from controlplane.runs.tokens import make_run_token
from tests.processes import wait_until
from trainer.config.loading import load_config
from trainer.data.replay import ReplayBuffer, add_transitions, transition_batch
from trainer.envs.builtin_reach import BuiltinReachEnv
from trainer.envs.intervention import InterventionEnv
from trainer.envs.teleop import TeleopSettings, TeleopSource
from trainer.link.client import TrainerLink
from trainer.robots.console_bridge import ConsoleBridge
from trainer.robots.driver import SimulatedRobot
from trainer.runner.interventions import close_env, with_interventions

CONSOLE_EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "builtin_rlpd_console.yaml"
POLICY_ACTION = 0.5
# +x, the gripper as it is (a takeover's gripper moves only once the operator changes it).
PUSH = [1.0, 0, 0, 0, 0, 0, 0.0]


class Robots:
    """Two simulated robots stepping at `hz` behind the run's link, with every step's
    applied actions recorded as (time, actions, taken over: an operator's step or a
    safety hold), every step's transitions added to RLPD's two buffers (`online`,
    `demo`) as an RLPD run adds them, and every message the link handed the console
    bridge in `received`.

    With `settings`, the robots are built here on `clock`; with `overrides` (of
    examples/builtin_rlpd_console.yaml) they are built as a run builds them
    (trainer.runner.interventions), on the run's own clock."""

    def __init__(
        self,
        url: str,
        run_id: int,
        settings: TeleopSettings | None = None,
        hz: float = 200.0,
        clock: Callable[[], float] = time.time,
        overrides: list[str] | None = None,
    ):
        self.env_core = BuiltinReachEnv(2, seed=0)
        self.link = TrainerLink(url, run_id, make_run_token(run_id))
        if overrides is not None:
            config = load_config(CONSOLE_EXAMPLE, overrides)
            self.env = with_interventions(self.env_core, config, self.link)
            self.source, self.bridge = self.env.source, self.env.console
        else:
            self.source = TeleopSource(2, 7, settings or TeleopSettings(), clock=clock)
            self.env = InterventionEnv(self.env_core, self.source)
            robots = [SimulatedRobot(self.env_core, copy, f"sim-{copy}") for copy in range(2)]
            self.bridge = ConsoleBridge(self.link, self.source, robots, lambda: "reach_red")
        self.received: list[dict] = []
        self.arrivals: list[tuple[float, dict]] = []  # each message with when it came
        self.link.on_command(self._receive)
        self.steps: list[tuple[float, torch.Tensor, torch.Tensor]] = []
        self.online, self.demo = ReplayBuffer(100_000), ReplayBuffer(100_000)
        self.ends: list[tuple[float, torch.Tensor, torch.Tensor]] = []  # terminated, success
        self.period, self.paused = 1.0 / hz, threading.Event()
        self._stop = threading.Event()
        self._obs = self.env.reset(0, self.env.init_states(0)[:2])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _receive(self, data: dict) -> None:
        self.received.append(data)
        self.arrivals.append((time.time(), data))
        self.bridge.handle(data)

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.paused.is_set():
                wanted = torch.full((2, 7), POLICY_ACTION)
                step = self.env.step(wanted)
                now = time.time()
                add_transitions(self.online, self.demo, transition_batch(self._obs, wanted, step))
                self._obs = step.obs
                self.steps.append((now, step.applied_actions[:], step.intervened | step.held))
                if bool(step.done.any()):
                    self.ends.append((now, step.terminated.clone(), step.success.clone()))
            time.sleep(self.period)

    def after(self, since: float) -> list[tuple[float, torch.Tensor, torch.Tensor]]:
        return [step for step in list(self.steps) if step[0] > since]

    def got(self, **fields) -> list[dict]:
        """The messages the bridge received that have these fields."""
        return [m for m in list(self.received) if all(m.get(k) == v for k, v in fields.items())]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        if isinstance(getattr(self.env, "console", None), ConsoleBridge):
            close_env(self.env)
        else:
            self.bridge.close()
        self.link.close(timeout=10)


class Console:
    """A browser's console socket, with the messages it received and, once the server
    closed it, the close code."""

    def __init__(self, url: str, run_id: int, cookie: str, operator: str):
        self.operator = operator
        self.socket = connect(
            url.replace("http", "ws") + f"/ws/console/{run_id}/",
            additional_headers={"Cookie": cookie}, origin=url, open_timeout=10,
        )  # fmt: skip
        self.received: list[dict] = []
        self.sent_mark = 0  # what had arrived when the last message was sent
        self.closed = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for raw in self.socket:
                self.received.append(json.loads(raw))
        except (ConnectionClosed, OSError):
            pass
        finally:
            self.closed.set()

    @property
    def close_code(self) -> int | None:
        return self.socket.close_code

    def send(self, **message) -> None:
        self.sent_mark = len(self.received)
        self.socket.send(json.dumps(message))

    def wait_for(self, test, what: str, timeout: float = 10.0) -> dict:
        """The first message since the last send that passes `test`."""
        found: list[dict] = []

        def seen() -> bool:
            found[:] = [m for m in self.received[self.sent_mark :] if test(m)]
            return bool(found)

        wait_until(seen, timeout, what, 0.01)
        return found[0]

    def reply(self, op: str, operator: str) -> dict:
        def test(message: dict) -> bool:
            return message.get("type") == "console" and any(
                r["op"] == op and r["operator"] == operator for r in message["replies"]
            )

        message = self.wait_for(test, f"the reply to {operator}'s {op}")
        return next(r for r in message["replies"] if r["op"] == op and r["operator"] == operator)

    def take_over(self, robot: int) -> None:
        self.send(op="take_over", robot=robot)
        assert self.reply("take_over", self.operator)["ok"]

    def close(self) -> None:
        self.socket.close()


def logged_in(name: str, role: str | None) -> Client:
    """A new user with that role (a group of that name), logged in by a client of its
    own (its session is the one the cookie names)."""
    user = get_user_model().objects.create_user(name, password="pw-for-tests")
    if role:
        user.groups.add(Group.objects.get_or_create(name=role)[0])
    client = Client()
    client.force_login(user)
    return client


def cookie_of(client: Client) -> str:
    return f"sessionid={client.cookies['sessionid'].value}"


def login(name: str, role: str | None) -> str:
    return cookie_of(logged_in(name, role))


def keep_driving(
    console: Console, stop: threading.Event, robot: int = 0, action: list[float] = PUSH
) -> threading.Thread:
    """The page's control loop: a command every 25 ms while the operator holds the robot."""

    def drive() -> None:
        while not stop.is_set():
            try:
                console.send(op="command", robot=robot, action=action)
            except Exception:
                return
            time.sleep(0.025)

    thread = threading.Thread(target=drive, daemon=True)
    thread.start()
    return thread


def take_over_and_drive(console: Console, robots: Robots, robot: int = 0) -> threading.Event:
    """The operator holds `robot` and one of their commands has been applied; the
    returned event stops the driving. With a real arm's deadman (0.15 s) a loaded machine
    can let go between the take-over and the first command (two trips through the web
    server), as it would a real operator's: like them, this takes over again."""
    pushed = torch.tensor(PUSH)
    for _ in range(5):
        console.take_over(robot)
        stop = threading.Event()
        keep_driving(console, stop, robot)

        def applied_or_lost() -> bool:
            return robots.source.mode(robot)[0] != "human" or any(
                bool(a[robot].eq(pushed).all()) for _, a, _ in list(robots.steps)
            )

        wait_until(applied_or_lost, 10, f"{console.operator}'s command applied", 0.01)
        if any(bool(a[robot].eq(pushed).all()) for _, a, _ in list(robots.steps)):
            return stop
        stop.set()
    raise AssertionError(f"the deadman let go of {console.operator} before each first command")


def first_zero_action(robots: Robots, since: float) -> float:
    """When robot 0 first stepped with a zero action after `since`."""
    found: list[float] = []

    def zero() -> bool:
        found[:] = [t for t, a, _ in robots.after(since) if bool(a[0].eq(0).all())][:1]
        return bool(found)

    wait_until(zero, 5, "a zero action", 0.005)
    return found[0]
