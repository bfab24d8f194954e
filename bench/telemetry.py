"""Telemetry: how fast trainer points reach PostgreSQL, and how soon a browser sees them.

`telemetry_ingest`: points per second stored in PostgreSQL when a trainer streams
iterations through the real link client (trainer.link.client.TrainerLink) to the real
consumer on the project's ASGI server (daphne), timed from the first send until every
message is acknowledged (acknowledged = committed); against a bare `COPY` of the same
rows into the same table, in the same run.

`telemetry_latency_p99`: milliseconds from a trainer's send (`link.metrics`) until a
browser's WebSocket on the run page (`/ws/runs/<id>/`, a logged-in session cookie)
receives the point, with 10 runs streaming at once; against a bare WebSocket echo
route (bench/telemetry_asgi.py) on the same server, round trip, same message rate.

`telemetry_latency_relay_floor`: the same p99 of ours against the floor of the path a
point takes: publishers at the same rate and size whose messages the same server only
passes through the channel layer to a browser socket each (no validation, storage or
acknowledgement).

Needs PostgreSQL and Redis (the deployment's channel layer); by default the databases
`armature_series` on 127.0.0.1:5432 and Redis db 14 (override with DATABASE_URL and
REDIS_URL). The database is migrated and its bench rows removed at the end.

    python bench/telemetry.py [--repeats 3] [--steps 1500] [--keys 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pg_database import ensure_database  # noqa: E402

from tests.processes import free_port, http_ok, start, stop, wait_until  # noqa: E402

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/armature_series"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/14"
LATENCY_RUNS = 10
# Messages per second per run: a trainer sends one per iteration, and iterations take a
# second or more on real tasks; 10 a second per run is a generous stream.
LATENCY_RATE_HZ = 10
LATENCY_SECONDS = 6.0
LATENCY_KEYS = 50
LATE_S = 15.0  # how long browsers keep listening after the trainers stop


def set_up(var_dir: Path) -> None:
    database_url = os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL)
    ensure_database(database_url)
    os.environ.update(
        ARMATURE_VAR_DIR=str(var_dir),
        DJANGO_SETTINGS_MODULE="controlplane.settings",
        DATABASE_URL=database_url,
        REDIS_URL=os.environ.get("REDIS_URL", DEFAULT_REDIS_URL),
    )
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)


def bench_fixtures() -> tuple:
    """A user with a session cookie, and an experiment to hang runs on."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    from controlplane.experiments.services import create_experiment

    user = get_user_model().objects.create_superuser(f"bench-{os.getpid()}", password="x")
    client = Client()
    client.force_login(user)
    experiment = create_experiment(f"bench-telemetry-{os.getpid()}", "algorithm: {name: ppo}\n")
    return user, client.cookies["sessionid"].value, experiment


def new_run(experiment, user):
    from controlplane.runs.models import Run, RunState

    return Run.objects.create(
        experiment=experiment, revision=experiment.latest_revision, config_yaml="",
        state=RunState.RUNNING, created_by=user,
    )  # fmt: skip


def step_values(keys: int, step: int) -> dict[str, float]:
    return {f"counts/task{i // 6}/h{5 * (i % 3 + 1)}/k{i}": float(step + i) for i in range(keys)}


# --- Ingest ---------------------------------------------------------------------------


def ingest_through_link(base: str, experiment, user, steps: int, keys: int) -> float:
    """Points/s from the first send until the last acknowledgement; checks the count."""
    from controlplane.runs.models import MetricPoint
    from controlplane.runs.tokens import make_run_token
    from trainer.link.client import TrainerLink

    run = new_run(experiment, user)
    link = TrainerLink(base, run.pk, make_run_token(run.pk), flush_timeout_s=300)
    wait_until(lambda: link.pending() == 0, 10, "the link")  # connected, nothing pending
    batches = [step_values(keys, step) for step in range(steps)]
    started = time.perf_counter()
    for step, values in enumerate(batches):
        link.metrics(step, values, at=1.7e9 + step)
    acknowledged = link.close()
    elapsed = time.perf_counter() - started
    stored = MetricPoint.objects.filter(key__run=run).count()
    if not acknowledged or stored != steps * keys:
        raise RuntimeError(f"stored {stored} of {steps * keys} points")
    return stored / elapsed


def bare_copy(experiment, user, steps: int, keys: int) -> float:
    """Points/s of one COPY of the same rows (key rows made beforehand) in one transaction."""
    from django.db import connection, transaction

    from controlplane.runs import metric_points

    run = new_run(experiment, user)
    ids = metric_points.key_ids(run.pk, step_values(keys, 0))
    rows = [
        (ids[name], step, value, 1.7e9 + step)
        for step in range(steps)
        for name, value in step_values(keys, step).items()
    ]
    started = time.perf_counter()
    with transaction.atomic(), connection.cursor() as cursor:
        with cursor.cursor.copy(
            "COPY runs_metricpoint (key_id, step, value, wall_time) FROM STDIN"
        ) as copy:
            for row in rows:
                copy.write_row(row)
    return len(rows) / (time.perf_counter() - started)


# --- Latency --------------------------------------------------------------------------


async def browser_latencies(
    urls: list[str], cookie: str, origin: str, stop_at: float, ready
) -> list[float]:
    """Seconds from each point's send time (its `time`) to its arrival, over every
    socket (one per run)."""
    from websockets.asyncio.client import connect

    latencies: list[float] = []

    async def watch(url: str) -> None:
        async with connect(
            url,
            additional_headers={"Cookie": f"sessionid={cookie}", "Origin": origin},
            max_size=None,
        ) as socket:
            ready.release()
            seen = 0
            while time.time() < stop_at and seen < LATENCY_RATE_HZ * LATENCY_SECONDS:
                try:
                    raw = await asyncio.wait_for(socket.recv(), timeout=0.5)
                except TimeoutError:
                    continue
                now = time.time()
                if raw.startswith("{"):
                    frame = json.loads(raw)
                    if frame.get("type") == "metrics":
                        latencies.append(now - frame["time"])
                        seen += 1

    await asyncio.gather(*(watch(url) for url in urls))
    return latencies


def stream_runs(base: str, runs: list, keys: int, seconds: float) -> None:
    """Each run's trainer, a process of its own as trainers are, sends LATENCY_RATE_HZ
    metrics messages a second through its link, stamped with the send time. (Ten links
    in one process measured the GIL instead: ten link threads polling their sockets.)"""
    import multiprocessing

    from controlplane.runs.tokens import make_run_token

    context = multiprocessing.get_context("spawn")
    start_at = time.time() + 5.0  # every trainer imported and connected by then
    trainers = [
        context.Process(
            target=one_trainer,
            args=(base, run.pk, make_run_token(run.pk), keys, start_at, seconds),
        )
        for run in runs
    ]
    for trainer in trainers:
        trainer.start()
    for trainer in trainers:
        trainer.join(timeout=start_at - time.time() + seconds + 60)


def one_trainer(base: str, run_id: int, token: str, keys: int, start_at: float,
                seconds: float) -> None:  # fmt: skip
    from trainer.link.client import TrainerLink

    link = TrainerLink(base, run_id, token)
    period = 1 / LATENCY_RATE_HZ
    time.sleep(max(0.0, start_at - time.time()))
    step, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        tick = time.monotonic()
        link.metrics(step, step_values(keys, step), at=time.time())
        step += 1
        time.sleep(max(0.0, period - (time.monotonic() - tick)))
    link.close()


def watch_browsers(urls, cookie, origin, stop_at, ready, results) -> None:
    """A browser process: its own interpreter, as browsers are not in the trainers'."""
    results.put(asyncio.run(browser_latencies(urls, cookie, origin, stop_at, ready)))


def p99_at_browsers(base: str, urls: list[str], cookie: str, send) -> float:
    """p99 ms of the points `send()` streams, as received on `urls` by a browser process
    (one socket per run, open before the first send)."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    ready, results = context.Semaphore(0), context.Queue()
    stop_at = time.time() + LATENCY_SECONDS + LATE_S
    browsers = context.Process(
        target=watch_browsers, args=(urls, cookie, base, stop_at, ready, results)
    )
    browsers.start()
    for _ in urls:
        if not ready.acquire(timeout=30):
            raise RuntimeError("a browser socket did not open")
    send()
    found = results.get(timeout=60)
    browsers.join()
    expected = len(urls) * LATENCY_RATE_HZ * LATENCY_SECONDS
    print(
        f"  browsers got {len(found)} points messages; p50 {percentile(found, 50) * 1000:.1f} "
        f"ms, p90 {percentile(found, 90) * 1000:.1f} ms, max {max(found) * 1000:.0f} ms"
    )
    missing = int(expected) - len(found)
    if missing > 0:  # counted as late as the wait allowed, so they cannot flatter p99
        print(f"  {missing} points messages never reached a browser in the window")
        found += [LATENCY_SECONDS + LATE_S] * missing
    return percentile(found, 99) * 1000


def latency_ours(base: str, experiment, user, cookie: str) -> float:
    runs = [new_run(experiment, user) for _ in range(LATENCY_RUNS)]
    ws_base = base.replace("http://", "ws://")
    urls = [f"{ws_base}/ws/runs/{run.pk}/" for run in runs]
    return p99_at_browsers(
        base, urls, cookie, lambda: stream_runs(base, runs, LATENCY_KEYS, LATENCY_SECONDS)
    )


def latency_relay(base: str, cookie: str) -> float:
    """The floor under ours: LATENCY_RUNS publishers at the same rate and message size
    whose messages the server only passes through the channel layer to a browser
    socket each (bench/telemetry_asgi.py's relay), with no validation, storage or
    acknowledgement."""
    from websockets.asyncio.client import connect

    ws_base = base.replace("http://", "ws://")
    values = step_values(LATENCY_KEYS, 0)

    async def publish(n: int) -> None:
        async with connect(f"{ws_base}/bench/relay/{n}/pub", max_size=None) as socket:
            step, deadline = 0, time.monotonic() + LATENCY_SECONDS
            while time.monotonic() < deadline:
                tick = time.monotonic()
                frame = {"type": "metrics", "step": step, "time": time.time(), "values": values}
                await socket.send(json.dumps(frame))
                step += 1
                await asyncio.sleep(max(0.0, 1 / LATENCY_RATE_HZ - (time.monotonic() - tick)))

    async def publish_all() -> None:
        await asyncio.gather(*(publish(n) for n in range(LATENCY_RUNS)))

    urls = [f"{ws_base}/bench/relay/{n}/sub" for n in range(LATENCY_RUNS)]
    return p99_at_browsers(base, urls, cookie, lambda: asyncio.run(publish_all()))


def latency_echo(base: str) -> float:
    """Round trips of LATENCY_RUNS echo sockets at the same rate and message size."""
    from websockets.asyncio.client import connect

    ws_base = base.replace("http://", "ws://")
    payload = json.dumps(step_values(LATENCY_KEYS, 0))

    async def one(latencies: list[float]) -> None:
        async with connect(f"{ws_base}/bench/echo/", max_size=None) as socket:
            deadline = time.monotonic() + LATENCY_SECONDS
            while time.monotonic() < deadline:
                sent = time.time()
                await socket.send(json.dumps({"t": sent, "values": payload}))
                reply = json.loads(await socket.recv())
                latencies.append(time.time() - reply["t"])
                await asyncio.sleep(max(0.0, 1 / LATENCY_RATE_HZ - (time.time() - sent)))

    async def all_sockets() -> list[float]:
        latencies: list[float] = []
        await asyncio.gather(*(one(latencies) for _ in range(LATENCY_RUNS)))
        return latencies

    return percentile(asyncio.run(all_sockets()), 99) * 1000


def start_web(work: Path) -> tuple[subprocess.Popen, str]:
    """The project's ASGI server (daphne) on a free port, with the bench's settings;
    its process and base URL."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "ARMATURE_WEB_URL": base, "PYTHONPATH": str(ROOT)}
    daphne = str(Path(sys.executable).parent / "daphne")
    command = [daphne, "-b", "127.0.0.1", "-p", str(port), "bench.telemetry_asgi:application"]
    return start(command, env, work / "web.log"), base


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


# --- Main -----------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1500, help="iterations per ingest repeat")
    parser.add_argument("--keys", type=int, default=200, help="metrics per iteration")
    parser.add_argument("--only", choices=("ingest", "latency"), help="run one half")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="armature-bench-telemetry-"))
    set_up(work / "var")
    user, cookie, experiment = bench_fixtures()
    server, base = start_web(work)
    ingest: list[float] = []
    copy: list[float] = []
    ours_p99: list[float] = []
    echo_p99: list[float] = []
    relay_p99: list[float] = []
    try:
        # /healthz would answer 503 here: no Ray head or worker runs, and none is needed.
        wait_until(lambda: http_ok(f"{base}/login/"), 60, "the web server")
        print(f"web server pid {server.pid}, log {work / 'web.log'}", flush=True)
        for _ in range(args.repeats if args.only != "latency" else 0):
            ingest.append(ingest_through_link(base, experiment, user, args.steps, args.keys))
            copy.append(bare_copy(experiment, user, args.steps, args.keys))
            print(f"ingest points/s: ours {ingest[-1]:.0f}, COPY {copy[-1]:.0f}", flush=True)
        for _ in range(args.repeats if args.only != "ingest" else 0):
            ours_p99.append(latency_ours(base, experiment, user, cookie))
            echo_p99.append(latency_echo(base))
            relay_p99.append(latency_relay(base, cookie))
            print(
                f"p99 ms: ours {ours_p99[-1]:.1f}, echo {echo_p99[-1]:.1f}, "
                f"relay {relay_p99[-1]:.1f}",
                flush=True,
            )
    finally:
        stop(server)
        experiment.runs.all().delete()
        experiment.delete()
        user.delete()
    if ingest:
        report("telemetry_ingest", statistics.median(ingest), statistics.median(copy),
               "points/s", "higher")  # fmt: skip
    if ours_p99:
        report("telemetry_latency_p99", statistics.median(ours_p99), statistics.median(echo_p99),
               "ms", "lower")  # fmt: skip
        report("telemetry_latency_relay_floor", statistics.median(ours_p99),
               statistics.median(relay_p99), "ms", "lower")  # fmt: skip


def report(name: str, ours: float, baseline: float, unit: str, better: str) -> None:
    print(
        f"RESULT bench={name} ours={ours:.1f} baseline={baseline:.1f} "
        f"ratio={ours / baseline:.3f} unit={unit} better={better}"
    )


if __name__ == "__main__":
    main()
