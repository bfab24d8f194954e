"""A control plane made of real processes (daphne, a Celery worker, a Ray head),
started from the same commands as `./armature up`, against the test database."""

import http.client
import json
import os
import shutil
import subprocess
import tempfile
import urllib.request
from pathlib import Path

from django.db import connection

from controlplane.core.head_keeper import RAY_START_DEADLINE
from controlplane.core.stack import (
    RAY_HEAD_ENV,
    RayHeadPorts,
    dashboard_url,
    ray_head_command,
    ray_node_command,
    ray_node_port_flags,
    web_command,
    worker_command,
)
from tests.processes import (
    RAY_STARTS,
    free_port,
    http_ok,
    start,
    stop,
    wait_until,
)


def test_database_url() -> str:
    """The URL of the database pytest-django created, for processes outside this one."""
    params = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{params['NAME']}"
    credentials = params["USER"] + (f":{params['PASSWORD']}" if params["PASSWORD"] else "")
    host = f"{params['HOST'] or '127.0.0.1'}:{params['PORT'] or 5432}"
    return f"postgres://{credentials}@{host}/{params['NAME']}"


NODES = "/api/v0/nodes?limit=1"


class HeadStartTimedOut(RuntimeError):
    """`ray start` exited at its own start-up deadline."""


class RayHead:
    """A Ray head of the test run's own, on free ports; never touches other Ray processes."""

    def __init__(
        self,
        log_dir: Path,
        ports: RayHeadPorts | None = None,
        env: dict[str, str] | None = None,
        token: str = "",
    ):
        """`env` overrides RAY_HEAD_ENV (e.g. RAY_AUTH_MODE=token); `token` is what the
        test sends to reach a head started with token authentication."""
        self.temp_dir = Path(tempfile.mkdtemp(prefix="armray-"))
        self.ports = ports or RayHeadPorts.choose()
        self.url = dashboard_url(self.ports)
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.log_path = log_dir / "ray-head.log"
        command = ray_head_command(self.temp_dir, self.ports, num_cpus=2)
        environ = {**os.environ, **RAY_HEAD_ENV, **(env or {})}
        for attempt in range(1, RAY_STARTS + 1):
            self._log_from = self.log_path.stat().st_size if self.log_path.exists() else 0
            self.process = start(command, environ, self.log_path)
            try:
                self.wait_ready()
                return
            except HeadStartTimedOut:
                stop(self.process)  # what the exited `ray start` left of its group
                if attempt == RAY_STARTS:
                    raise

    def wait_ready(self) -> None:
        # Generous: on a loaded machine (the whole suite in parallel) a head's agents
        # start slowly and its state API answers in seconds, not milliseconds.
        wait_until(lambda: self._up() and self._get("/api/version") is not None, 240,
                   "the Ray dashboard")  # fmt: skip
        wait_until(lambda: self._up() and b'"ALIVE"' in (self._get(NODES, 10) or b""), 150,
                   "a live node")  # fmt: skip

    def _up(self) -> bool:
        """True while `ray start --block` runs; if it exited the head will never come up,
        so say why at once instead of waiting out the deadline."""
        if self.process.poll() is None:
            return True
        with open(self.log_path, "rb") as log:  # this start's lines only
            log.seek(self._log_from)
            tail = log.read().decode(errors="replace")[-3000:]
        failure = HeadStartTimedOut if RAY_START_DEADLINE in tail else RuntimeError
        raise failure(f"the Ray head exited with {self.process.returncode}:\n{tail}")

    def _get(self, path: str, timeout_s: float = 2) -> bytes | None:
        request = urllib.request.Request(self.url + path, headers=self.headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as reply:
                return reply.read()
        except (OSError, http.client.HTTPException):  # not (yet) the dashboard answering
            return None

    def alive_nodes(self) -> int:
        reply = self._get("/api/v0/nodes?limit=100")
        if reply is None:
            return 0
        nodes = json.loads(reply).get("data", {}).get("result", {}).get("result", [])
        return sum(1 for node in nodes if node.get("state") == "ALIVE")

    def close(self) -> None:
        stop(self.process)


class RayNode:
    """A Ray node on this machine joined to a test's own `head`, labelled with its node
    rank as `./armature join` labels one, e.g. a robot node beside the GPU node."""

    def __init__(self, head: RayHead, node_rank: int, log_dir: Path, num_cpus: int = 1):
        self.temp_dir = Path(tempfile.mkdtemp(prefix="armnode-"))
        nodes = head.alive_nodes()
        command = ray_node_command(
            f"127.0.0.1:{head.ports.gcs}", node_rank, self.temp_dir, ray_node_port_flags({}),
            advertise="127.0.0.1", num_cpus=num_cpus,
        )  # fmt: skip
        self.process = start(command, {**os.environ, **RAY_HEAD_ENV},
                             log_dir / f"ray-node-{node_rank}.log")  # fmt: skip
        wait_until(lambda: head.alive_nodes() > nodes, 90, f"Ray node {node_rank} to join")

    def close(self) -> None:
        stop(self.process)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


class Stack:
    """Web server and Celery worker processes, started and stopped on demand."""

    def __init__(self, log_dir: Path, env: dict[str, str], host: str = "127.0.0.1"):
        """`host`: the address the web server listens on and is reached at (a bridge's,
        for trainers in other network namespaces)."""
        self.log_dir = log_dir
        self.host = host
        self.port = free_port()
        self.url = f"http://{host}:{self.port}"
        inherited = {k: v for k, v in os.environ.items() if k != "DJANGO_ALLOW_ASYNC_UNSAFE"}
        self.env = {
            **inherited,
            "DATABASE_URL": test_database_url(),
            "ARMATURE_WEB_URL": self.url,
            **env,
        }
        self.web: subprocess.Popen | None = None
        self.worker: subprocess.Popen | None = None

    def start_web(self) -> str:
        self.web = start(web_command(self.host, self.port), self.env, self.log_dir / "web.log")
        wait_until(lambda: http_ok(f"{self.url}/login/"), 60, "the web server")
        return self.url

    def start_worker(self) -> None:
        self.worker = start(
            worker_command(self.log_dir / "celerybeat-schedule"),
            self.env,
            self.log_dir / "worker.log",
        )

    def stop_worker(self) -> None:
        if self.worker is not None:
            # A warm shutdown takes a prefork worker 6-10 s (billiard's pool threads each
            # finish a sleep); nothing a test checks needs it, so the rest is killed.
            stop(self.worker, grace_s=2)
            self.worker = None

    def close(self) -> None:
        self.stop_worker()
        if self.web is not None:
            stop(self.web)
            self.web = None
