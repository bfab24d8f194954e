"""The processes that make up a running control plane, in one place.

`./armature up` supervises them; the end-to-end tests start the same commands.
"""

import sys
from dataclasses import dataclass, field
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


@dataclass
class RayHeadPorts:
    """Ports of a local Ray head. 6379 is Redis's on most machines, so the GCS avoids it."""

    gcs: int = 6390
    dashboard: int = 8265
    client_server: int = 10001
    dashboard_agent_listen: int = 52365
    extra: dict[str, int] = field(default_factory=dict)


def ray_head_command(temp_dir: Path, ports: RayHeadPorts, num_cpus: int | None = None) -> list[str]:
    """`ray start --head --block`: stays in the foreground so a supervisor can stop it.

    Everything binds to loopback; no other machine is reachable or needed.
    """
    command = [
        str(BIN / "ray"), "start", "--head", "--block", "--disable-usage-stats",
        "--node-ip-address", "127.0.0.1",
        "--port", str(ports.gcs),
        "--dashboard-host", "127.0.0.1",
        "--dashboard-port", str(ports.dashboard),
        "--ray-client-server-port", str(ports.client_server),
        "--dashboard-agent-listen-port", str(ports.dashboard_agent_listen),
        "--temp-dir", str(temp_dir),
    ]  # fmt: skip
    for flag, port in ports.extra.items():
        command += [f"--{flag}", str(port)]
    if num_cpus is not None:
        command += ["--num-cpus", str(num_cpus)]
    return command


RAY_HEAD_ENV = {
    # The local head listens on loopback only; token auth would add nothing there.
    "RAY_AUTH_MODE": "disabled",
    # Between the SIGTERM and the SIGKILL of a stopped job: time for the trainer to
    # finish its iteration and save a checkpoint to resume from.
    "RAY_JOB_STOP_WAIT_TIME_S": "20",
}


def dashboard_url(ports: RayHeadPorts) -> str:
    return f"http://127.0.0.1:{ports.dashboard}"
