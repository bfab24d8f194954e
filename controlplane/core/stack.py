"""The processes that make up a running control plane, in one place.

`./armature up` supervises them; the end-to-end tests start the same commands.
"""

import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

BIN = Path(sys.executable).parent


def web_command(host: str, port: int) -> list[str]:
    return [str(BIN / "daphne"), "-b", host, "-p", str(port), "controlplane.asgi:application"]


def worker_command(beat_schedule: Path, concurrency: int = 4) -> list[str]:
    # Prefork: the tasks' soft and hard time limits (runs/tasks.py) are enforced only
    # by a pool of processes. Several children keep the health-check round trip
    # answered while a long task runs. The embedded beat runs the periodic run
    # reconciliation (one worker per deployment).
    return [
        str(BIN / "celery"), "-A", "controlplane", "worker",
        "--pool", "prefork", "--concurrency", str(concurrency),
        "--loglevel", "INFO", "--without-gossip", "--without-mingle",
        "--beat", "--schedule", str(beat_schedule),
    ]  # fmt: skip


# Every port a local Ray head opens, with the `ray start` flag that sets it and the
# environment variable that fixes it (deploy/ENVIRONMENT.md). A port not fixed is one the
# system gives out free at start, so two heads on one machine (two checkouts, or the app
# and the test suite) never collide: Ray's own defaults (10001 for the client server,
# 52365 for the dashboard agent, …) are fixed numbers.
RAY_PORT_SETTINGS = {
    "gcs": ("port", "ARMATURE_RAY_PORT"),
    "dashboard": ("dashboard-port", "ARMATURE_RAY_DASHBOARD_PORT"),
    "client_server": ("ray-client-server-port", "ARMATURE_RAY_CLIENT_SERVER_PORT"),
    "dashboard_agent_listen": (
        "dashboard-agent-listen-port",
        "ARMATURE_RAY_DASHBOARD_AGENT_LISTEN_PORT",
    ),
    "dashboard_agent_grpc": ("dashboard-agent-grpc-port", "ARMATURE_RAY_DASHBOARD_AGENT_GRPC_PORT"),
    "metrics_export": ("metrics-export-port", "ARMATURE_RAY_METRICS_EXPORT_PORT"),
    "runtime_env_agent": ("runtime-env-agent-port", "ARMATURE_RAY_RUNTIME_ENV_AGENT_PORT"),
    "node_manager": ("node-manager-port", "ARMATURE_RAY_NODE_MANAGER_PORT"),
    "object_manager": ("object-manager-port", "ARMATURE_RAY_OBJECT_MANAGER_PORT"),
}
# Worker processes: 0 and 0 let each bind a port the system picks (Ray's default is the
# fixed range 10002-19999); a range here is for firewalls that need one.
WORKER_PORT_SETTINGS = {
    "min_worker": ("min-worker-port", "ARMATURE_RAY_MIN_WORKER_PORT"),
    "max_worker": ("max-worker-port", "ARMATURE_RAY_MAX_WORKER_PORT"),
}
# Kept when free, so the dashboard address stays the same from one start to the next.
# Not Ray's 6379: that is Redis's on most machines.
PREFERRED_RAY_PORTS = {"gcs": 6390, "dashboard": 8265}


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports free right now: all sockets are held until every one is
    bound, so the system cannot hand out the same port twice."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _port_from_env(environ: Mapping[str, str], name: str) -> int | None:
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or not 0 <= int(raw) <= 65535:
        raise ValueError(f"{name}={raw!r} is not a port number (0-65535)")
    return int(raw)


@dataclass(frozen=True)
class RayHeadPorts:
    """Every port of a local Ray head (see RAY_PORT_SETTINGS)."""

    gcs: int
    dashboard: int
    client_server: int
    dashboard_agent_listen: int
    dashboard_agent_grpc: int
    metrics_export: int
    runtime_env_agent: int
    node_manager: int
    object_manager: int
    min_worker: int = 0
    max_worker: int = 0

    @classmethod
    def choose(cls, **fixed: int) -> "RayHeadPorts":
        """The ports in `fixed`, and free ones for the rest."""
        unknown = set(fixed) - set(RAY_PORT_SETTINGS) - set(WORKER_PORT_SETTINGS)
        if unknown:
            raise TypeError(f"not a Ray head port: {', '.join(sorted(unknown))}")
        missing = [name for name in RAY_PORT_SETTINGS if name not in fixed]
        taken = set(fixed.values())
        candidates = [p for p in free_ports(len(missing) + len(taken)) if p not in taken]
        return cls(**fixed, **dict(zip(missing, candidates, strict=False)))

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> "RayHeadPorts":
        """`./armature up`'s ports: those fixed by ARMATURE_RAY_*_PORT, the preferred
        ones when free, free ones otherwise."""
        fixed = {}
        for name, (_, variable) in {**RAY_PORT_SETTINGS, **WORKER_PORT_SETTINGS}.items():
            port = _port_from_env(environ, variable)
            if port is not None:
                fixed[name] = port
        for name, port in PREFERRED_RAY_PORTS.items():
            if name not in fixed and port_is_free(port):
                fixed[name] = port
        return cls.choose(**fixed)

    def flags(self) -> list[str]:
        """The `ray start` options that set every one of these ports."""
        flags = []
        for name, (flag, _) in {**RAY_PORT_SETTINGS, **WORKER_PORT_SETTINGS}.items():
            flags += [f"--{flag}", str(getattr(self, name))]
        return flags


def ray_head_command(temp_dir: Path, ports: RayHeadPorts, num_cpus: int | None = None) -> list[str]:
    """`ray start --head --block`: stays in the foreground so a supervisor can stop it.

    Everything binds to loopback; no other machine is reachable or needed.
    """
    command = [
        str(BIN / "ray"), "start", "--head", "--block", "--disable-usage-stats",
        "--node-ip-address", "127.0.0.1",
        "--dashboard-host", "127.0.0.1",
        *ports.flags(),
        "--temp-dir", str(temp_dir),
    ]  # fmt: skip
    if num_cpus is not None:
        command += ["--num-cpus", str(num_cpus)]
    return command


def ray_head_env(token: str = "") -> dict[str, str]:
    """A local head's environment. With `token`, Ray's token authentication is on: its
    dashboard, Jobs API and gRPC ports refuse whoever lacks the token - on a shared
    machine every local user can reach loopback ports. Without, it is off (the test
    suite's own heads)."""
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token} if token else {}
    return {
        "RAY_AUTH_MODE": "disabled",
        **auth,
        # Between the SIGTERM and the SIGKILL of a stopped job: time for the trainer to
        # finish its iteration and save a checkpoint to resume from.
        "RAY_JOB_STOP_WAIT_TIME_S": "20",
    }


RAY_HEAD_ENV = ray_head_env()


DEFAULT_WEB_PORT = 8000


def web_port(environ: Mapping[str, str]) -> int:
    """`./armature up`'s web port: ARMATURE_PORT when set, else 8000 when free, else a
    free one (the start banner says which)."""
    configured = _port_from_env(environ, "ARMATURE_PORT")
    if configured is not None:
        return configured
    return DEFAULT_WEB_PORT if port_is_free(DEFAULT_WEB_PORT) else free_ports(1)[0]


def dashboard_url(ports: RayHeadPorts) -> str:
    return f"http://127.0.0.1:{ports.dashboard}"
