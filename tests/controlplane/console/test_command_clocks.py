"""The command window on one clock, end to end: a live daphne whose clocks (wall and
monotonic) are shifted, the run's real trainer link, and the robots built as a console
run builds them (trainer.runner.interventions, on the run's own clock). Neither a web
server ahead nor a trainer ahead changes which commands the robot applies."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from tests.controlplane.console.scene import PUSH, Console, Robots, keep_driving, login
from tests.processes import wait_until
from tests.runs import submitted_run

pytestmark = pytest.mark.django_db(transaction=True)

# Imported at the start of every Python process that has its folder on PYTHONPATH.
SHIFT_CLOCKS = """
import os, time
_shift = float(os.environ["ARMATURE_TEST_CLOCK_SHIFT_S"])
_time, _monotonic = time.time, time.monotonic
time.time = lambda: _time() + _shift
time.monotonic = lambda: _monotonic() + _shift
"""
# The robots as the console example runs them, with a deadman long enough that only the
# command window decides what is applied, stepping fast.
OVERRIDES = [
    "env.interventions.deadman_s=5",
    "env.interventions.command_window_s=0.1",
    "env.interventions.control_hz=200",
    "env.interventions.real_time=false",
]
LATE = [0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0]


@pytest.fixture
def web_with_clocks(stack_factory, tmp_path):
    """A live web server whose time.time() and time.monotonic() are `shift_s` ahead."""

    def start(shift_s: float):
        (tmp_path / "sitecustomize.py").write_text(SHIFT_CLOCKS)
        path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
        web = stack_factory(PYTHONPATH=path, ARMATURE_TEST_CLOCK_SHIFT_S=str(shift_s))
        web.start_web()
        return web

    return start


class HoldingGate:
    """A TCP forwarder for the trainer's link whose server → trainer direction can be
    held: what the server writes meanwhile arrives when it is released."""

    def __init__(self, upstream_port: int):
        self.upstream = ("127.0.0.1", upstream_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.open = threading.Event()
        self.open.set()
        self.sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                trainer, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream, timeout=5)
            self.sockets += [trainer, server]
            threading.Thread(target=self._pump, args=(trainer, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, trainer, True), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, holdable: bool) -> None:
        try:
            while data := source.recv(65536):
                if holdable:
                    self.open.wait()
                target.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        self.open.set()
        for end in self.sockets:
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            end.close()


@pytest.fixture
def drive(web_with_clocks):
    """Start a web server with shifted clocks, the robots behind a holding gate, and
    olga holding robot 0 from her console."""
    made: list = []

    def start(shift_s: float) -> tuple[Robots, Console, HoldingGate]:
        web = web_with_clocks(shift_s)
        run = submitted_run("clocks")
        gate = HoldingGate(web.port)
        robots = Robots(gate.url, run.pk, overrides=OVERRIDES)
        olga = Console(web.url, run.pk, login("olga", "operator"), "olga")
        made.extend([gate, robots, olga])
        olga.wait_for(lambda m: m.get("type") == "console", "the robots' state")
        olga.take_over(0)
        return robots, olga, gate

    yield start
    for thing in reversed(made):
        thing.close()


def pushed(steps, action: list[float]) -> list[bool]:
    """For each step: did robot 0 step with `action`?"""
    return [bool(applied[0].eq(applied.new_tensor(action)).all()) for _, applied, _ in steps]


def test_with_the_web_servers_clocks_5_s_ahead_a_command_held_03_s_is_not_applied(drive):
    robots, olga, gate = drive(5.0)
    stop = threading.Event()
    keep_driving(olga, stop)  # fresh commands: applied, whatever the server's clock says
    wait_until(lambda: any(pushed(robots.steps, PUSH)), 10, "a fresh command applied", 0.01)
    stop.set()
    time.sleep(0.2)  # the last one has aged out of its window

    gate.open.clear()  # the network holds what the server sends the trainer
    olga.send(op="command", robot=0, action=LATE, id="late")
    time.sleep(0.3)
    released_at = time.time()
    gate.open.set()
    wait_until(lambda: robots.got(id="late"), 10, "the held command at the robot", 0.01)
    wait_until(lambda: len(robots.after(released_at)) >= 10, 10, "steps after it", 0.01)

    after = robots.after(released_at)
    assert not any(pushed(after, LATE)), "a command 0.3 s old was applied (window 0.1 s)"
    assert all(bool(intervened[0]) for _, _, intervened in after)  # held still instead
    # The trainer's estimate of the server's clock: 5 s ahead, less the fastest transit.
    offset = robots.bridge.server_clock.offset(time.monotonic())
    assert 4.95 < offset <= 5.0


def test_with_the_trainers_clock_01_s_ahead_fresh_commands_are_applied(drive):
    robots, olga, _ = drive(-0.1)  # the server 0.1 s behind: the trainer 0.1 s ahead
    stop = threading.Event()
    keep_driving(olga, stop)
    wait_until(lambda: robots.got(op="command"), 10, "the first command at the robot", 0.01)
    started = time.time()
    time.sleep(1.0)
    stop.set()
    # The steps taken just after a command reached the robot: each had a fresh command
    # (sent every 25 ms, living 100 ms). A busy machine may stall the sender or the link
    # for longer than the window, which leaves other steps without one; a trainer that
    # judged ages on its own clock, 0.1 s ahead, would find every command stale.
    came = [at for at, m in list(robots.arrivals) if m.get("op") == "command"]
    fresh = [
        step for step in robots.after(started + 0.1)
        if step[0] < started + 0.9 and any(0 < step[0] - at <= 0.02 for at in came)
    ]  # fmt: skip
    applied = pushed(fresh, PUSH)
    assert len(applied) >= 10
    assert sum(applied) >= 0.8 * len(applied), f"{sum(applied)} of {len(applied)} applied"
    offset = robots.bridge.server_clock.offset(time.monotonic())
    assert -0.15 < offset <= -0.1
