"""Console frames: how many camera frames a second reach an operator's console for a
LIBERO robot while its run steps at its normal rate.

`console_fps`: frames of LIBERO's agent-view camera received per second by a logged-in
console socket (`/ws/console/<run>/`) that watches the robot, at the console's default
rate and quality (`env.interventions.camera_fps` 15, `camera_quality` 80). The robot is
one LIBERO copy in a process of its own, as a trainer's, stepped as fast as it steps,
with the console source and bridge a run has (the frames are the images of its last
observation, JPEG-encoded only while someone watches). Baseline: the rate asked for,
15. Printed beside it: the different images received a second (no frame is newer than
the env's last observation) and the env's steps a second, watched and before anyone
watched (what encoding frames costs the run). Target >= 15.

Needs PostgreSQL and Redis, as bench/telemetry.py, and LIBERO (`./armature
install-libero`); without LIBERO it says so and exits 0.

    python bench/console_fps.py [--seconds 10] [--size 128]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.telemetry import report  # noqa: E402
from bench.teleop import console_bench  # noqa: E402

CAMERA = "agentview"
WARM_UP_S = 3.0
ALONE_S = 5.0


def robot_process(base: str, run_id: int, token: str, size: int, ready, stop_event, rates):
    """One LIBERO copy stepped with a still action: first alone, then with its console
    bridge at the defaults; puts the env's steps per second of each on `rates`."""
    import torch

    from trainer.envs.intervention import InterventionEnv
    from trainer.envs.libero_env import LiberoVectorEnv
    from trainer.envs.teleop import TeleopSettings, TeleopSource
    from trainer.link.client import TrainerLink
    from trainer.robots.console_bridge import ConsoleBridge
    from trainer.robots.driver import SimulatedRobot

    torch.set_num_threads(1)
    core = LiberoVectorEnv(1, vision_language=True, image_size=size, max_episode_steps=10**9)
    source = TeleopSource(1, core.action_dim, TeleopSettings(), clock=time.time)
    env = InterventionEnv(core, source)
    env.reset(0, env.init_states(0)[:1])
    still = torch.zeros(1, core.action_dim)
    steps, started = 0, time.monotonic()
    while time.monotonic() - started < ALONE_S:  # the env's own rate, nobody watching
        env.step(still)
        steps += 1
    rates.put(steps / (time.monotonic() - started))
    link = TrainerLink(base, run_id, token)
    bridge = ConsoleBridge(link, source, [SimulatedRobot(core, 0, "libero-0")])
    ready.set()
    steps, started = 0, time.monotonic()
    while not stop_event.is_set():
        env.step(still)
        steps += 1
    rates.put(steps / (time.monotonic() - started))
    bridge.close()
    link.close(timeout=5)
    core.close()


async def watched_frames(url: str, cookie: str, origin: str, seconds: float) -> list[dict]:
    """Watch robot 0's agent-view camera (asking again each second, as the page does) and
    keep each frame received after the warm-up, with its arrival time."""
    from websockets.asyncio.client import connect

    frames: list[dict] = []
    async with connect(url, additional_headers={"Cookie": cookie}, origin=origin,
                       max_size=None) as socket:  # fmt: skip
        started = time.monotonic()

        async def watch() -> None:
            while True:
                await socket.send(json.dumps({"op": "watch", "robot": 0, "camera": CAMERA}))
                await asyncio.sleep(1.0)

        watching = asyncio.ensure_future(watch())
        try:
            async for raw in socket:
                now = time.monotonic() - started
                if now > WARM_UP_S + seconds:
                    break
                message = json.loads(raw)
                if message.get("type") != "console" or now < WARM_UP_S:
                    continue
                frames += [
                    {**frame, "at": now}
                    for frame in message.get("frames", [])
                    if frame["robot"] == 0 and frame["camera"] == CAMERA
                ]
        finally:
            watching.cancel()
    return frames


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--size", type=int, default=128, help="camera images' side (pixels)")
    args = parser.parse_args()
    from trainer.envs.libero_setup import LiberoNotInstalledError, import_libero

    try:
        import_libero()
    except LiberoNotInstalledError as error:
        print(f"bench/console_fps.py: {error}; nothing to measure")
        return 0
    context = multiprocessing.get_context("spawn")
    ready, stop_robot, rates = context.Event(), context.Event(), context.Queue()
    robot_args = (args.size, ready, stop_robot, rates)
    with console_bench(
        "armature-bench-console-fps-", robot_process, robot_args, ready, stop_robot, context,
        ready_s=180,
    ) as bench:  # fmt: skip
        frames = asyncio.run(
            watched_frames(bench.console_url, bench.cookie, bench.base, args.seconds)
        )
        stop_robot.set()
        alone, watched = rates.get(timeout=60), rates.get(timeout=60)
    fps = len(frames) / args.seconds
    size = f"{frames[0]['width']}x{frames[0]['height']}" if frames else "none"
    kib = sum(len(frame["jpeg"]) * 3 / 4 for frame in frames) / max(len(frames), 1) / 1024
    # A frame sent again before the env's next observation is the same JPEG.
    images = len({frame["jpeg"] for frame in frames}) / args.seconds
    print(f"  {len(frames)} frames of {CAMERA} ({size}, {kib:.1f} KiB each) in "
          f"{args.seconds:.0f} s: {images:.1f} different images a second; the env "
          f"stepped {watched:.1f} times a second watched, {alone:.1f} alone")  # fmt: skip
    report("console_fps", fps, 15.0, "frames/s", "higher")
    return 0


if __name__ == "__main__":
    sys.exit(main())
