"""`./armature join HEAD`: this machine becomes a further node of the Ray cluster whose
head `./armature up --advertise ADDR` runs on another machine (docs/multi-node.md).

It starts `ray start --address HEAD --block` labelled with the node's rank (what
placements name), with the head's token and a temp folder of its own; starts it again
when it stops by itself (the head restarted); and stops that node, and only it, on
Ctrl-C. It needs no control plane settings (no Django): a node runs trainers, not the
web server.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import TextIO

from controlplane.core.stack import (
    PREFERRED_RAY_PORTS,
    AddressError,
    UnsafeFolderError,
    discard_output,
    ipv4,
    private_ray_temp_dir,
    ray_node_command,
    ray_node_port_flags,
    require_local,
)

ROOT = Path(__file__).resolve().parents[2]
# Between SIGTERM and SIGKILL of the node: `ray start --block` lets the node drain (up to
# Ray's RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S, 30 s) and stops its processes.
STOP_GRACE_S = 40.0
# How long the head's port is tried before join gives up (a head still starting).
REACH_TIMEOUT_S = 20.0
# A node that stops by itself is started again after a pause that doubles with each
# failure in a row, up to the last; one that ran this long had joined (a new count).
RESTART_PAUSE_S = 5.0
MAX_RESTART_PAUSE_S = 60.0
RESTART_AFTER_S = 120.0
# Every process of the node carries it, so those left behind are found by PID.
NODE_MARKER = "ARMATURE_RAY_NODE"
# What Ray prints when starting again cannot help: join stops and says why instead.
FATAL = {
    "InvalidAuthToken": "the head refused this node's Ray token: give it the head's own "
    "(a copy of the head's var/ray_auth_token, or the RAY_AUTH_TOKEN it was started with)",
    "Version mismatch": "this node's Ray or Python is not the head's: join from a "
    "checkout of the same commit, with the same Python version",
}
# Ray's label values: alphanumerics, `-`, `_`, `.`; alphanumeric at both ends; ≤ 63.
LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")


class JoinError(Exception):
    """A bad argument or an unreachable head: the message says what to change."""


def var_dir(environ: Mapping[str, str]) -> Path:
    """This checkout's var/ folder, as controlplane/settings.py finds it."""
    return Path(environ.get("ARMATURE_VAR_DIR") or ROOT / "var")


def node_temp_dir(environ: Mapping[str, str], rank: int, chosen: Path | None = None) -> Path:
    """The node's own Ray temp folder, made or checked (stack.private_ray_temp_dir):
    `chosen` (--temp-dir), else var/ray-node-N, apart from the head's var/ray even where
    both share a disk. var/ is made its user's alone first, as `up` does: Ray makes its
    folder writable by all."""
    if chosen is None:
        var = var_dir(environ)
        var.mkdir(parents=True, exist_ok=True, mode=0o700)
        var.chmod(0o700)
        chosen = var / f"ray-node-{rank}"
    return private_ray_temp_dir(chosen.absolute(), f"armature-ray-node-{rank}").resolve()


def head_address(text: str) -> tuple[str, int]:
    """HEAD as `ADDR[:PORT]` (the port `up` prints; 6390 when left out); ADDR an IPv4
    address or a name that resolves to one."""
    host, colon, port = text.strip().rpartition(":")
    if not colon:
        host, port = text.strip(), str(PREFERRED_RAY_PORTS["gcs"])
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise JoinError(f"HEAD {text!r}: {port!r} is not a port number (1-65535)")
    try:
        socket.getaddrinfo(host, int(port), socket.AF_INET, socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        raise JoinError(
            f"HEAD {text!r}: {host!r} is neither an IPv4 address nor a name this machine "
            "resolves; give ADDR:PORT as `./armature up --advertise` prints it, e.g. "
            "10.0.0.5:6390"
        ) from None
    return host, int(port)


def node_rank(text: str) -> int:
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (1, 2, …)")
    rank = int(text)
    if rank == 0:
        raise argparse.ArgumentTypeError(
            "0 is the head's rank (`./armature up`); a joining node takes 1, 2, …"
        )
    return rank


def count(text: str) -> int:
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a count (0, 1, 2, …)")
    return int(text)


def label_value(text: str) -> str:
    if not LABEL_VALUE.match(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} cannot be a Ray label: letters, digits, '-', '_' and '.', starting "
            "and ending with a letter or digit, at most 63 characters"
        )
    return text


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="./armature join",
        description="Start a Ray node on this machine and join it to the cluster whose "
        "head `./armature up --advertise ADDR` runs; Ctrl-C takes it out again.",
        epilog="The head's token: --token-file, --token, RAY_AUTH_TOKEN, or this checkout's "
        "var/ray_auth_token (same machine or shared var/), in that order.",
    )
    add = parser.add_argument
    add(
        "head",
        metavar="HEAD",
        help="the head's ADDR:PORT, as `up` prints it (port 6390 if left out)",
    )
    add("--node-rank", type=node_rank, required=True, metavar="N",
        help="this node's rank: 1, 2, … (the head is 0); placements name nodes by it")  # fmt: skip
    add("--node-group", type=label_value, metavar="NAME",
        help="also label the node with a node group (armature.io/node-group)")  # fmt: skip
    add("--token-file", type=Path, metavar="PATH",
        help="file holding the head's Ray token (a copy of its var/ray_auth_token)")  # fmt: skip
    add("--token", help="the head's Ray token itself (visible to `ps`; prefer --token-file)")
    add("--advertise", metavar="ADDR",
        help="this node's address for the others (default: the one facing HEAD)")  # fmt: skip
    add("--temp-dir", type=Path, metavar="PATH",
        help="Ray's folder for this node's sockets and logs (default: var/ray-node-N)")  # fmt: skip
    add("--num-cpus", type=count, metavar="N", help="CPUs Ray may use here (default: all)")
    add("--num-gpus", type=count, metavar="N", help="GPUs Ray may use here (default: all)")
    return parser


def auth_env(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment that makes the node present the head's token."""
    if args.token_file is not None:
        try:
            token = args.token_file.read_text().strip()
        except OSError as error:
            raise JoinError(f"--token-file {args.token_file}: {error.strerror}") from None
        if not token:
            raise JoinError(f"--token-file {args.token_file} is empty")
    elif args.token is not None:
        token = args.token.strip()
        if not token:
            raise JoinError("--token is empty")
    elif environ.get("RAY_AUTH_TOKEN", "").strip():
        token = environ["RAY_AUTH_TOKEN"].strip()
    elif (var_dir(environ) / "ray_auth_token").is_file():
        token = (var_dir(environ) / "ray_auth_token").read_text().strip()
    elif environ.get("RAY_AUTH_MODE") == "disabled":  # a head started without auth
        return {"RAY_AUTH_MODE": "disabled"}
    else:
        raise JoinError(
            "no Ray token: the head (`./armature up`) requires the one in its "
            "var/ray_auth_token; copy that file here and pass --token-file PATH, or set "
            "RAY_AUTH_TOKEN"
        )
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}


def wait_for_head(host: str, port: int, timeout_s: float | None = None) -> None:
    """Fail fast and clearly when the head cannot be reached: Ray itself retries for
    minutes and then says little."""
    deadline = time.monotonic() + (REACH_TIMEOUT_S if timeout_s is None else timeout_s)
    while True:
        try:
            with socket.create_connection((host, port), timeout=3):
                return
        except OSError as error:
            if time.monotonic() > deadline:
                raise JoinError(
                    f"cannot reach the Ray head at {host}:{port} ({error.strerror or error}): "
                    f"is `./armature up --advertise {host}` running there, and does its "
                    f"firewall let this machine reach port {port}?"
                ) from None
        time.sleep(0.5)


def node_pids(marker: str) -> list[int]:
    """Live processes carrying `marker` in their environment: this node's."""
    wanted = f"{NODE_MARKER}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if wanted in environ and state != "Z":
            found.append(int(entry.name))
    return found


def kill_leftovers(marker: str) -> None:
    """Processes of this node that outlived `ray start` (a worker that ignored the
    SIGTERM): SIGTERM, then SIGKILL, each by its PID, never by name."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = node_pids(marker)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5
        while pids and node_pids(marker) and time.monotonic() < deadline:
            time.sleep(0.2)


def say(text: str, stream: TextIO | None = None, end: str = "\n") -> None:
    """Print, and when the reader is gone (`join | tee`, tee stopped by the same Ctrl-C)
    drop the output from then on: a closed pipe never stops join from stopping its node."""
    try:
        print(text, file=stream or sys.stdout, end=end, flush=True)
    except OSError:
        discard_output()


class NodeKeeper:
    """Keeps this machine's Ray node in the cluster until Ctrl-C or SIGTERM: a node that
    stops by itself (its head was restarted or went away, or Ray gave up starting it on
    a busy machine) is started again once the head answers, after a growing pause."""

    def __init__(
        self,
        make_command: Callable[[], list[str]],
        env: Mapping[str, str],
        marker: str,
        head: tuple[str, int],
    ) -> None:
        self.make_command, self.env, self.marker, self.head = make_command, env, marker, head
        self.node: subprocess.Popen | None = None
        self.stop_asked: list[float] = []  # when each Ctrl-C/SIGTERM came
        self.fatal: str | None = None  # why starting the node again is no use

    def stop(self, signum: int, frame: FrameType | None) -> None:
        # The node has a session of its own: the terminal's Ctrl-C reaches join only,
        # which stops the node; a second one kills it at once. The node is told before
        # anything is printed: with `join | tee`, tee exits on the same Ctrl-C.
        sig = signal.SIGKILL if self.stop_asked else signal.SIGTERM
        self.stop_asked.append(time.monotonic())
        if self.node is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.node.pid, sig)
        say(f"\njoin: stopping this Ray node ({'now' if self.stop_asked[1:] else 'cleanly'})")

    def run(self) -> int:
        previous = {sig: signal.signal(sig, self.stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        failures = 0
        try:
            while not self.stop_asked:
                began = time.monotonic()
                status = self._run_once()
                if self.stop_asked:
                    break
                if self.fatal:
                    say(f"join: {self.fatal}", sys.stderr)
                    return 2
                # A node that ran a while had joined: its next failure starts a new count.
                failures = 1 if time.monotonic() - began > RESTART_AFTER_S else failures + 1
                pause = min(RESTART_PAUSE_S * 2 ** (failures - 1), MAX_RESTART_PAUSE_S)
                say(
                    f"join: the Ray node stopped by itself (exit status {status}; its logs are "
                    f"in {self.marker}/session_latest/logs); starting it again in {pause:.0f} s "
                    "once the head answers (Ctrl-C gives up)",
                    sys.stderr,
                )
                self._pause(pause)
                while not self.stop_asked:
                    try:
                        wait_for_head(*self.head, timeout_s=RESTART_PAUSE_S)
                        break
                    except JoinError:
                        continue
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        say("join: this Ray node has left the cluster")
        return 0

    def _run_once(self) -> int:
        self.node = subprocess.Popen(
            self.make_command(), env=dict(self.env), start_new_session=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
        )  # fmt: skip
        if self.stop_asked:  # asked while it was being started: not told yet
            os.killpg(self.node.pid, signal.SIGTERM)
        reader = threading.Thread(target=self._echo, args=(self.node.stdout,), daemon=True)
        reader.start()
        try:
            while self.node.poll() is None:
                try:
                    self.node.wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    if self.stop_asked and time.monotonic() - self.stop_asked[0] > STOP_GRACE_S:
                        os.killpg(self.node.pid, signal.SIGKILL)
        finally:
            kill_leftovers(self.marker)
            reader.join(timeout=5)
        return self.node.returncode

    def _echo(self, output: TextIO) -> None:
        """The node's output, passed on, watched for what no restart can fix."""
        for line in output:
            say(line, end="")
            for sign, reason in FATAL.items():
                if sign in line:
                    self.fatal = reason

    def _pause(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stop_asked and time.monotonic() < deadline:
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    environ = dict(os.environ if environ is None else environ)
    args = parser().parse_args(argv)
    try:
        host, port = head_address(args.head)
        if args.advertise:
            advertise = ipv4("--advertise", args.advertise)
            require_local("--advertise", advertise)
        else:
            advertise = None
        auth = auth_env(args, environ)
        ray_node_port_flags(environ)  # a wrong ARMATURE_RAY_*_PORT is named now
        wait_for_head(host, port)
        try:
            temp_dir = node_temp_dir(environ, args.node_rank, args.temp_dir)
        except OSError as error:
            raise JoinError(
                f"cannot make Ray's folder for this node ({error.filename}: {error.strerror})"
            ) from None
    except (JoinError, AddressError, UnsafeFolderError, ValueError) as error:
        print(f"join: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C while waiting for the head: nothing started
        return 130

    def command() -> list[str]:  # free ports chosen afresh at each start
        return ray_node_command(
            f"{host}:{port}", args.node_rank, temp_dir, ray_node_port_flags(environ),
            node_group=args.node_group, advertise=advertise, num_cpus=args.num_cpus,
            num_gpus=args.num_gpus,
        )  # fmt: skip

    marker = str(temp_dir)
    env = {**environ, **auth, NODE_MARKER: marker}
    print(
        f"join: node rank {args.node_rank} joining the Ray head at {host}:{port} "
        f"(temp folder {temp_dir}); Ctrl-C takes it out",
        flush=True,
    )
    return NodeKeeper(command, env, marker, (host, port)).run()


if __name__ == "__main__":
    sys.exit(main())
