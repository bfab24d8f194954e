"""Health checks of every component the control plane depends on.

One place decides what "up" means; `/healthz` and the live status panel both
call `collect_status`, which measures at most once per `STATUS_MAX_AGE_S` and shares
one measurement among everyone asking meanwhile: a worker check sends a Celery task,
and a public `/healthz` must not let its callers flood the queue.
"""

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field

from asgiref.sync import sync_to_async
from celery.exceptions import TimeoutError as CeleryTimeoutError
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection

from controlplane.celery import app as celery_app
from controlplane.core.tasks import ping
from controlplane.runs import ray_jobs

CHECK_TIMEOUT_S = 3.0
STATUS_MAX_AGE_S = 1.0
LABELS = {"channel_layer": "Channel layer"}


@dataclass
class Check:
    name: str
    up: bool
    latency_ms: float | None = None
    detail: str = ""
    info: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return LABELS.get(self.name, self.name.capitalize())


def _timed(name: str, probe) -> Check:
    """Run a blocking probe that returns (detail, info); any exception means down."""
    started = time.perf_counter()
    try:
        detail, info = probe()
    except Exception as exc:  # a health check reports failures, it never raises them
        return Check(name, False, None, f"{type(exc).__name__}: {exc}".strip())
    return Check(name, True, round((time.perf_counter() - started) * 1000, 1), detail, info)


def _probe_database() -> tuple[str, dict]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    return connection.vendor, {}


def _probe_broker() -> tuple[str, dict]:
    with celery_app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, interval_start=0, timeout=CHECK_TIMEOUT_S)
        return conn.transport.driver_type, {}


def _probe_worker() -> tuple[str, dict]:
    # A real round trip: broker → worker → result backend. `expires` drops pings that
    # wait in the queue while no worker runs, so they do not pile up.
    result = ping.apply_async(args=[time.time()], expires=CHECK_TIMEOUT_S * 2, retry=False)
    try:
        result.get(timeout=CHECK_TIMEOUT_S, interval=0.02)
    except CeleryTimeoutError as exc:
        raise TimeoutError(f"no worker answered within {CHECK_TIMEOUT_S:.0f} s") from exc
    result.forget()
    return "round trip", {}


def _probe_ray() -> tuple[str, dict]:
    nodes = ray_jobs.live_nodes(timeout_s=CHECK_TIMEOUT_S)
    if not nodes:
        raise ConnectionError(f"{settings.RAY_ADDRESS}: the cluster has no live node")
    cpus = sum(n.get("resources_total", {}).get("CPU", 0) for n in nodes)
    gpus = sum(n.get("resources_total", {}).get("GPU", 0) for n in nodes)
    info = {"nodes": len(nodes), "cpus": int(cpus), "gpus": int(gpus)}
    shown = ", ".join(counted(info[key], word) for key, word in
                      (("nodes", "node"), ("cpus", "CPU"), ("gpus", "GPU")))  # fmt: skip
    return shown, info


def counted(number: int, word: str) -> str:
    """ "1 node", "2 nodes", "0 GPUs"."""
    return f"{number} {word}" if number == 1 else f"{number} {word}s"


async def _check_channel_layer() -> Check:
    started = time.perf_counter()
    try:
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.send(channel, {"type": "health.ping"})
        await asyncio.wait_for(layer.receive(channel), CHECK_TIMEOUT_S)
    except Exception as exc:  # reported, never raised
        return Check("channel_layer", False, None, f"{type(exc).__name__}: {exc}".strip())
    latency = round((time.perf_counter() - started) * 1000, 1)
    return Check("channel_layer", True, latency, type(layer).__name__)


async def _check_broker_and_worker() -> list[Check]:
    broker = await sync_to_async(_timed, thread_sensitive=False)("broker", _probe_broker)
    if not broker.up:
        return [broker, Check("worker", False, None, "broker unreachable")]
    worker = await sync_to_async(_timed, thread_sensitive=False)("worker", _probe_worker)
    return [broker, worker]


async def measure_status() -> list[Check]:
    """Check every component concurrently; the slowest check bounds the wait."""
    database = database_sync_to_async(_timed)("database", _probe_database)
    ray = sync_to_async(_timed, thread_sensitive=False)("ray", _probe_ray)
    db_check, queue_checks, layer_check, ray_check = await asyncio.gather(
        database, _check_broker_and_worker(), _check_channel_layer(), ray
    )
    return [db_check, *queue_checks, layer_check, ray_check]


class SharedMeasurement:
    """The latest measurement while it is younger than `max_age_s`; otherwise one new
    measurement, awaited by every caller that asks before it is done."""

    def __init__(self, measure: Callable[[], Awaitable[list[Check]]], max_age_s: float):
        self._measure = measure
        self.max_age_s = max_age_s
        self._latest: tuple[float, list[Check]] | None = None
        self._running: asyncio.Task | None = None

    async def get(self) -> list[Check]:
        if self._latest is not None and time.monotonic() - self._latest[0] < self.max_age_s:
            return self._latest[1]
        loop = asyncio.get_running_loop()
        task = self._running
        # A task of another event loop (a finished test request's, say) cannot be awaited.
        if task is None or task.done() or task.get_loop() is not loop:
            task = self._running = loop.create_task(self._measure_and_keep())
        # shield: a caller that goes away must not cancel the others' measurement.
        return await asyncio.shield(task)

    async def _measure_and_keep(self) -> list[Check]:
        checks = await self._measure()
        self._latest = (time.monotonic(), checks)
        return checks

    def forget(self) -> None:
        self._latest, self._running = None, None


shared_status = SharedMeasurement(measure_status, STATUS_MAX_AGE_S)


async def collect_status() -> list[Check]:
    """Every component's check, measured at most once per STATUS_MAX_AGE_S."""
    return await shared_status.get()


def status_as_json(checks: list[Check], detailed: bool = True) -> dict:
    """The report; without `detailed`, only the overall status and each component's
    up/down (no latency, error text or topology)."""
    return {
        "status": "up" if all(c.up for c in checks) else "down",
        "checks": {
            c.name: {k: v for k, v in asdict(c).items() if k != "name"}
            if detailed
            else {"up": c.up}
            for c in checks
        },
    }
