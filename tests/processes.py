"""Starting and stopping the real processes the end-to-end tests talk to."""

import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from controlplane.core.head_keeper import STARTS

# `ray start` gives its raylet a fixed 30 s to register with the GCS, then exits saying
# RAY_START_DEADLINE. Beside the whole suite on two cores that happens now and then; a
# fresh start comes up (the suite's own Ray nodes are what is tested, not Ray's start-up
# on a busy box), so tests start a node that hit it again, as `./armature up` does its
# head (controlplane/core/head_keeper.py), up to RAY_STARTS times in all.
RAY_STARTS = STARTS


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(command: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
    """Start `command` in its own process group, its output going to `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "ab")  # noqa: SIM115  (closed with the process)
    return subprocess.Popen(
        command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def stop(process: subprocess.Popen, grace_s: float = 8.0) -> None:
    """SIGTERM the whole group, SIGKILL what is left after `grace_s`."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(poll_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status < 500
    except OSError:
        return False


def pids_with_env(name: str, value: str) -> list[int]:
    """Processes whose environment has name=value: how a test finds every process it
    spawned, including grandchildren that moved to sessions of their own."""
    marker = f"{name}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in environ and state != "Z":
            found.append(int(entry.name))
    return found
