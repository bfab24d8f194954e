"""Machines on one host for the multi-node tests: network namespaces, each joined to the
host by a veth pair whose host end sits on a bridge, in a private /24 of 10.231.0.0/16
used only here. The host is 10.231.X.1, namespace i is 10.231.X.(i+2); the namespaces
reach each other through the bridge and the host reaches them all. Needs root and
iproute2's `ip`."""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass

_COUNT = itertools.count()


@dataclass(frozen=True)
class Namespace:
    name: str
    address: str

    def exec(self, command: list[str]) -> list[str]:
        """`command` run inside this namespace."""
        return ["ip", "netns", "exec", self.name, *command]

    def holds(self, pid: int) -> bool:
        """Whether process `pid` runs in this namespace's network."""
        try:
            return os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(self.path).st_ino
        except FileNotFoundError:
            return False

    @property
    def path(self) -> str:
        return f"/run/netns/{self.name}"

    def pids(self) -> list[int]:
        listed = subprocess.run(["ip", "netns", "pids", self.name], capture_output=True, text=True)
        return [int(pid) for pid in listed.stdout.split()]


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    if shutil.which("ip") is None:
        return "network namespaces need iproute2's `ip` command"
    probe = f"armprobe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as error:
        return f"cannot create a network namespace here: {error}"
    _ip("netns", "del", probe)
    return None


def _free_subnet() -> str:
    """A 10.231.X prefix no interface of the host uses (two test sessions at once)."""
    used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    start = os.getpid() % 200
    for offset in range(250):
        prefix = f"10.231.{(start + offset) % 250}"
        if f" {prefix}." not in used:
            return prefix
    raise RuntimeError("no free 10.231.X.0/24 on this host")


@dataclass(frozen=True)
class Bridge:
    tag: str  # the prefix of every namespace and link made for it
    host: str  # the host's address on the bridge
    spaces: list[Namespace]


@contextlib.contextmanager
def namespaces(count: int) -> Iterator[Bridge]:
    """`count` namespaces on one bridge of their own. Afterwards, even after a failure:
    every process still in a namespace is killed (by PID: only the test's run there),
    and the namespaces, veths and bridge are deleted."""
    tag = f"arm{os.getpid() % 100000}{next(_COUNT)}x"  # interface names: ≤ 15 characters
    prefix = _free_subnet()
    bridge = f"{tag}br"
    made: list[Namespace] = []
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"{prefix}.1/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i in range(count):
            space = Namespace(f"{tag}n{i}", f"{prefix}.{i + 2}")
            _ip("netns", "add", space.name)
            made.append(space)
            host_end, inner = f"{tag}v{i}", f"{tag}p{i}"
            _ip("link", "add", host_end, "type", "veth", "peer", "name", inner)
            _ip("link", "set", host_end, "master", bridge)
            _ip("link", "set", host_end, "up")
            _ip("link", "set", inner, "netns", space.name)
            inside = ["ip", "netns", "exec", space.name, "ip"]
            for args in (
                ["link", "set", "lo", "up"],
                ["link", "set", inner, "name", "eth0"],
                ["addr", "add", f"{space.address}/24", "dev", "eth0"],
                ["link", "set", "eth0", "up"],
            ):
                subprocess.run([*inside, *args], check=True, capture_output=True, timeout=30)
        yield Bridge(tag, f"{prefix}.1", made)
    finally:
        for space in made:
            _kill_all(space)
            subprocess.run(["ip", "netns", "del", space.name], capture_output=True)
        for i in range(count):  # deleting a host end deletes its peer too
            subprocess.run(["ip", "link", "del", f"{tag}v{i}"], capture_output=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)


def _kill_all(space: Namespace) -> None:
    """SIGKILL what is left in `space`: only the test's processes run there."""
    deadline = time.monotonic() + 10
    while (pids := space.pids()) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)


def leftovers(tag: str) -> list[str]:
    """Namespaces and links whose names start with `tag` that still exist."""
    spaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    names = [line.split()[0] for line in spaces.splitlines() if line.strip()]
    names += [line.split(":")[1].strip().split("@")[0] for line in links.splitlines()]
    return [name for name in names if name.startswith(tag)]
