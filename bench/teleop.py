"""Teleop: how soon an operator's command is applied by the robot, and how soon a lost
operator's robot gets a zero action.

`teleop_p50` / `teleop_p99`: milliseconds from an operator's command leaving the browser
socket (`/ws/console/<run>/`, a logged-in session) until the env worker's step applies
it: web server → channel layer → the run's trainer link → the console bridge → the
teleop source → `InterventionEnv.step`. The robot is the built-in env stepped at 1 kHz
in a process of its own, as a trainer is; its link reports each command's application
time (one clock: the same machine). 1,200 commands at 100 a second while 10 other runs
stream metrics to the same server. Baseline: a bare WebSocket echo on the same server
(bench/telemetry_asgi.py), round trip, at the same time and rate.

`teleop_placed_p50` / `_p99` / `_deadman`: the same, for a robot stepped by a placed
env worker (robot 1 of the run), which reaches the web server over a robot link of its
own while the run's link, held by another process (the driver), has no robots: the
console finds the process that owns the robot (docs/console.md, "Layouts").

`teleop_deadman`: the worst milliseconds, over 20 trials each, from an operator's link
being lost (the socket closed mid-takeover; or left open but silent, a frozen tab)
until the robot's step applies a zero action. Target 200 ms; the baseline printed is the
echo's worst round trip in the latency part.

Needs PostgreSQL and Redis, as bench/telemetry.py (same defaults and overrides).

    python bench/teleop.py [--commands 1200] [--trials 20] [--layout one|placed|both]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.telemetry import (  # noqa: E402
    LATENCY_RUNS,
    bench_fixtures,
    new_run,
    percentile,
    report,
    set_up,
    start_web,
    stream_runs,
)
from tests.processes import http_ok, stop, wait_until  # noqa: E402

COMMAND_HZ = 100
STEP_HZ = 1000
PUSH = [1.0, 0, 0, 0, 0, 0, -1.0]
DEADMAN_S = 0.15
LOSSES = ("operator link lost", "heartbeat lost")


# --- The robot: a trainer's process with one simulated robot behind the run's link ------


def robot_process(
    base: str, run_id: int, token: str, zeros, ready, stop_event,
    link_source: str | None = None, robot: int = 0,
) -> None:  # fmt: skip
    """Steps the built-in env at STEP_HZ with the console source; puts on `zeros` the
    time of each zero action that follows a lost takeover. With `source`, the process
    is a placed env worker (`link_source`, e.g. env-1): robot `robot` of the run's
    `robot + 1`, reached over a robot link of its own; its takeovers' audit would go to
    the run's driver, here nowhere."""
    import torch

    from trainer.envs.builtin_reach import BuiltinReachEnv
    from trainer.envs.intervention import InterventionEnv
    from trainer.envs.teleop import TeleopSettings, TeleopSource
    from trainer.link.client import TrainerLink
    from trainer.robots.console_bridge import ConsoleBridge
    from trainer.robots.driver import SimulatedRobot

    torch.set_num_threads(1)
    core = BuiltinReachEnv(1, seed=0, max_episode_steps=10**9)
    source = TeleopSource(1, 7, TeleopSettings(deadman_s=DEADMAN_S), clock=time.time)
    env = InterventionEnv(core, source)
    link = TrainerLink(base, run_id, token, source=link_source)
    audit = None if link_source is None else (lambda kind, data: None)
    bridge = ConsoleBridge(link, source, [SimulatedRobot(core, 0, f"sim-{robot}")],
                           first_robot=robot, total_robots=robot + 1, audit=audit)  # fmt: skip
    env.reset(0, env.init_states(0)[:1])
    policy = torch.full((1, 7), 0.5)
    ready.set()
    seen, lost = 0, False
    while not stop_event.is_set():
        step = env.step(policy)
        if len(source.takeovers) > seen:  # a takeover ended before or in this step
            seen = len(source.takeovers)
            lost = source.takeovers[-1].reason in LOSSES
        # The zero action after a loss is a safety hold (`held`), not a human's step.
        if lost and bool(step.held[0]) and bool(step.applied_actions[0].eq(0).all()):
            zeros.put((time.time(), source.takeovers[-1].reason))
            lost = False
        time.sleep(1 / STEP_HZ)
    bridge.close()
    link.close(timeout=5)


# --- The operator ------------------------------------------------------------------------


async def operator_latencies(
    url: str, cookie: str, origin: str, commands: int, robot: int = 0
) -> list[float]:
    """Take the robot over, send `commands` at COMMAND_HZ; seconds from each send to its
    application by the env, from the `applied` times the robot reports."""
    from websockets.asyncio.client import connect

    sent: dict[str, float] = {}
    latencies: list[float] = []
    async with connect(url, additional_headers={"Cookie": cookie}, origin=origin,
                       max_size=None) as socket:  # fmt: skip
        await socket.send(json.dumps({"op": "take_over", "robot": robot}))

        async def read() -> None:
            async for raw in socket:
                message = json.loads(raw)
                if message.get("type") != "console":
                    continue
                for applied in message["applied"]:
                    if applied["id"] in sent:
                        latencies.append(applied["at"] - sent.pop(applied["id"]))
                if len(latencies) >= commands:
                    return

        reader = asyncio.ensure_future(read())
        for n in range(commands):
            tick = time.time()
            sent[f"c{n}"] = tick
            await socket.send(json.dumps({"op": "command", "robot": robot, "action": PUSH,
                                          "id": f"c{n}"}))  # fmt: skip
            await asyncio.sleep(max(0.0, 1 / COMMAND_HZ - (time.time() - tick)))
        await socket.send(json.dumps({"op": "release", "robot": robot}))
        try:  # the last reports arrive with the robot's next console messages
            await asyncio.wait_for(reader, 2)
        except TimeoutError:
            reader.cancel()
    lost = commands - len(latencies)
    if lost:
        print(f"  {lost} commands were not reported applied (superseded before a step)")
    return latencies


async def echo_latencies(base: str, count: int) -> list[float]:
    from websockets.asyncio.client import connect

    latencies = []
    async with connect(base.replace("http://", "ws://") + "/bench/echo/") as socket:
        for _ in range(count):
            tick = time.time()
            await socket.send(json.dumps({"op": "command", "robot": 0, "action": PUSH}))
            await socket.recv()
            latencies.append(time.time() - tick)
            await asyncio.sleep(max(0.0, 1 / COMMAND_HZ - (time.time() - tick)))
    return latencies


async def lose_the_link(url: str, cookie: str, origin: str, silent: bool, robot: int = 0) -> float:
    """Take over, drive for a moment, then lose the link; the time it was lost."""
    from websockets.asyncio.client import connect

    socket = await connect(url, additional_headers={"Cookie": cookie}, origin=origin,
                           max_size=None)  # fmt: skip
    await socket.send(json.dumps({"op": "take_over", "robot": robot}))
    for _ in range(12):
        await socket.send(json.dumps({"op": "command", "robot": robot, "action": PUSH}))
        await asyncio.sleep(0.025)
    if silent:  # the socket stays open; nothing more is sent
        lost_at = time.time()
        await asyncio.sleep(0.6)
        await socket.close()
        return lost_at
    socket.transport.abort()  # the connection drops without a closing handshake
    return time.time()


# --- A web server and a robot process, for the console benches -------------------------


@dataclass
class ConsoleBench:
    base: str  # the web server's address
    cookie: str  # a logged-in session's Cookie header
    run_id: int
    console_url: str  # the run's console socket
    experiment: Any
    user: Any


@contextlib.contextmanager
def console_bench(
    prefix: str, robot: Callable, robot_args: tuple, ready, stop_robot, context,
    ready_s: float = 60.0,
) -> Iterator[ConsoleBench]:  # fmt: skip
    """A migrated database, a logged-in user, a live web server and a running run whose
    robot process (`robot(base, run_id, token, *robot_args)`, started in `context`) has
    set `ready`; all stopped and removed afterwards."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    set_up(work / "var")
    user, cookie, experiment = bench_fixtures()
    server, base = start_web(work)
    process = None
    try:
        wait_until(lambda: http_ok(f"{base}/login/"), 60, "the web server")
        from controlplane.runs.tokens import make_run_token

        run = new_run(experiment, user)
        process = context.Process(
            target=robot, args=(base, run.pk, make_run_token(run.pk), *robot_args)
        )
        process.start()
        if not ready.wait(ready_s):
            raise RuntimeError("the robot process did not start")
        url = base.replace("http://", "ws://") + f"/ws/console/{run.pk}/"
        yield ConsoleBench(base, f"sessionid={cookie}", run.pk, url, experiment, user)
    finally:
        stop_robot.set()
        if process is not None:
            process.join(30)
        stop(server)
        experiment.runs.all().delete()
        experiment.delete()
        user.delete()


# --- Main ---------------------------------------------------------------------------------


def measure(args: argparse.Namespace, placed: bool) -> tuple[list, list, dict]:
    """One layout's latencies (ours, the echo's) and deadman delays (per way of losing
    the link). Placed: the robot is robot 1, stepped by an env worker process over its
    own robot link (env-1), while the run's own link, in another process, has none."""
    context = multiprocessing.get_context("spawn")
    zeros, ready, stop_robot = context.Queue(), context.Event(), context.Event()
    robot = 1 if placed else 0
    robot_args = (zeros, ready, stop_robot, *(("env-1", robot) if placed else ()))
    with console_bench(
        "armature-bench-teleop-", robot_process, robot_args, ready, stop_robot, context,
    ) as bench:  # fmt: skip
        base, cookie, url = bench.base, bench.cookie, bench.console_url
        experiment, user = bench.experiment, bench.user
        driver = None
        if placed:  # the run's own link: the driver's process, no robots of its own
            from controlplane.runs.tokens import make_run_token
            from trainer.link.client import TrainerLink

            driver = TrainerLink(base, bench.run_id, make_run_token(bench.run_id))

        # Latency, with 10 other runs streaming metrics meanwhile.
        others = [new_run(experiment, user) for _ in range(LATENCY_RUNS)]
        seconds = args.commands / COMMAND_HZ + 8
        streaming = threading.Thread(target=stream_runs, args=(base, others, 50, seconds))
        streaming.start()
        time.sleep(5.5)  # stream_runs starts its trainers 5 s from now

        async def both() -> tuple[list[float], list[float]]:
            ours = operator_latencies(url, cookie, base, args.commands, robot)
            return await asyncio.gather(ours, echo_latencies(base, args.commands))

        ours, echo = asyncio.run(both())
        streaming.join()
        print(f"  ours: {len(ours)} commands, p50 {percentile(ours, 50) * 1000:.2f} ms, p99 "
              f"{percentile(ours, 99) * 1000:.2f} ms, max {max(ours) * 1000:.1f} ms; echo p50 "
              f"{percentile(echo, 50) * 1000:.2f}, p99 {percentile(echo, 99) * 1000:.2f} ms",
              flush=True)  # fmt: skip

        # Deadman: each way of losing the link, `trials` times.
        delays: dict[str, list[float]] = {"closed": [], "silent": []}
        while not zeros.empty():
            print(f"  before the trials, a takeover was lost: {zeros.get()[1]}")
        for trial in range(2 * args.trials):
            silent = trial % 2 == 1
            lost_at = asyncio.run(lose_the_link(url, cookie, base, silent, robot))
            zero_at, reason = zeros.get(timeout=10)
            if zero_at < lost_at:
                raise RuntimeError(f"the takeover was lost before the link ({reason})")
            delays["silent" if silent else "closed"].append(zero_at - lost_at)
            time.sleep(0.1)
        for way, values in delays.items():
            print(f"  link {way}: zero action after {statistics.median(values) * 1000:.0f} ms "
                  f"median, {max(values) * 1000:.0f} ms worst")  # fmt: skip
        if driver is not None:
            driver.close(timeout=5)
    return ours, echo, delays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", type=int, default=1200)
    parser.add_argument("--trials", type=int, default=20, help="per way of losing the link")
    parser.add_argument("--layout", choices=("one", "placed", "both"), default="both")
    args = parser.parse_args()
    if args.layout == "both":  # each layout in a process of its own: its own server and key
        for layout in ("one", "placed"):
            command = [sys.executable, __file__, "--layout", layout,
                       "--commands", str(args.commands), "--trials", str(args.trials)]  # fmt: skip
            subprocess.run(command, check=True)
        return
    placed = args.layout == "placed"
    name = "teleop_placed" if placed else "teleop"
    where = "in an env worker of its own" if placed else "behind the run's link"
    print(f"{name}: the robot {where}", flush=True)
    ours, echo, delays = measure(args, placed)
    report(f"{name}_p50", percentile(ours, 50) * 1000, percentile(echo, 50) * 1000, "ms", "lower")
    report(f"{name}_p99", percentile(ours, 99) * 1000, percentile(echo, 99) * 1000, "ms", "lower")
    worst = max(max(values) for values in delays.values()) * 1000
    report(f"{name}_deadman", worst, max(echo) * 1000, "ms", "lower")


if __name__ == "__main__":
    main()
