"""The processes that make up a running control plane, in one place.

`./armature up` supervises them, `./armature join` starts a further Ray node
(controlplane/core/join.py); the end-to-end tests start the same commands. Nothing here
imports Django: `join` runs on machines that have no control plane settings.
"""

import ipaddress
import os
import shutil
import socket
import stat
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from trainer.cluster import NODE_GROUP_LABEL, NODE_RANK_LABEL

BIN = Path(sys.executable).parent
LOOPBACK = "127.0.0.1"
EVERY_INTERFACE = "0.0.0.0"


def web_command(host: str, port: int) -> list[str]:
    # daphne, refusing oversized request bodies as they arrive (core/web_server.py).
    return [
        sys.executable, "-m", "controlplane.core.web_server",
        "-b", host, "-p", str(port), "controlplane.asgi:application",
    ]  # fmt: skip


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


class AddressError(ValueError):
    """An address given to `up` or `join` that cannot work; the message says why and
    what to give instead."""


def ipv4(option: str, value: str) -> str:
    """`value` as an IPv4 address, or AddressError naming `option`: Ray's node addresses
    and `host:port` strings are IPv4."""
    try:
        return str(ipaddress.IPv4Address(value.strip()))
    except ValueError:
        raise AddressError(
            f"{option} {value!r} is not an IPv4 address (e.g. 10.0.0.5"
            + (", or 0.0.0.0 for every interface)" if option == "--bind" else ")")
        ) from None


def is_local_address(address: str) -> bool:
    """Whether this machine holds `address` (a socket can be bound to it)."""
    with socket.socket() as sock:
        try:
            sock.bind((address, 0))
        except OSError:
            return False
    return True


def require_local(option: str, address: str) -> None:
    if address != EVERY_INTERFACE and not is_local_address(address):
        raise AddressError(
            f"{option} {address} is not an address of this machine (`ip -4 addr` lists "
            "them); give the address of the interface the other nodes reach"
        )


@dataclass(frozen=True)
class HeadAddresses:
    """Where `./armature up` listens (`bind`: the web server, and Ray's dashboard when
    other nodes join) and the address it gives to others (`advertise`: Ray's node
    address, which joining nodes dial, and the host of ARMATURE_WEB_URL, which trainers
    on every node report to). The default is one machine: everything on loopback."""

    bind: str = LOOPBACK
    advertise: str = LOOPBACK

    @classmethod
    def choose(cls, bind: str, advertise: str | None = None) -> "HeadAddresses":
        """Checked `--bind` and `--advertise` values. Without `advertise`, a specific
        bind address is also the advertised one; 0.0.0.0 advertises loopback (one
        machine, the UI reachable from others)."""
        bind = ipv4("--bind", bind)
        require_local("--bind", bind)
        if not advertise:
            return cls(bind, LOOPBACK if bind == EVERY_INTERFACE else bind)
        advertise = ipv4("--advertise", advertise)
        if advertise == EVERY_INTERFACE:
            raise AddressError(
                "--advertise 0.0.0.0 is not an address other machines can dial: give the "
                "one they reach this machine at (and --bind 0.0.0.0 to listen everywhere)"
            )
        if bind not in (EVERY_INTERFACE, advertise):
            raise AddressError(
                f"--advertise {advertise} with --bind {bind}: the web server would listen "
                f"on {bind} only, not where the other nodes are told to go; "
                f"use --bind {advertise}, or --bind 0.0.0.0 for every interface"
            )
        require_local("--advertise", advertise)
        return cls(bind, advertise)

    @property
    def serves_other_nodes(self) -> bool:
        return not ipaddress.IPv4Address(self.advertise).is_loopback

    @property
    def ray_listen(self) -> str:
        """The dashboard's (Jobs API's) listen address: loopback unless other nodes join,
        so `--bind 0.0.0.0` alone opens the UI only, as before."""
        return self.bind if self.serves_other_nodes else LOOPBACK

    @property
    def ray_local(self) -> str:
        """Where processes on this machine reach the dashboard."""
        return LOOPBACK if self.ray_listen in (LOOPBACK, EVERY_INTERFACE) else self.ray_listen

    def web_url(self, port: int) -> str:
        return f"http://{self.advertise}:{port}"


LOCAL = HeadAddresses()


def ray_head_command(
    temp_dir: Path,
    ports: RayHeadPorts,
    num_cpus: int | None = None,
    addresses: HeadAddresses = LOCAL,
) -> list[str]:
    """`ray start --head --block`: stays in the foreground so a supervisor can stop it.

    By default everything binds to loopback and no other machine is reachable or
    needed; with `addresses` advertising another address, Ray nodes elsewhere can join
    (`ray_node_command`). The head is node rank 0, the rank placements name it by.
    """
    command = [
        str(BIN / "ray"), "start", "--head", "--block", "--disable-usage-stats",
        "--node-ip-address", addresses.advertise,
        "--dashboard-host", addresses.ray_listen,
        "--labels", f"{NODE_RANK_LABEL}=0",
        *ports.flags(),
        "--temp-dir", str(temp_dir),
    ]  # fmt: skip
    if num_cpus is not None:
        command += ["--num-cpus", str(num_cpus)]
    return command


# The ports a joining node opens: every one of the head's but these, which only the
# head runs.
HEAD_ONLY_PORTS = {"gcs", "dashboard", "client_server"}
NODE_PORT_NAMES = [name for name in RAY_PORT_SETTINGS if name not in HEAD_ONLY_PORTS]


def ray_node_port_flags(environ: Mapping[str, str]) -> list[str]:
    """The `ray start` options for a joining node's ports: those fixed by
    ARMATURE_RAY_*_PORT (a firewall's), free ones for the rest, never Ray's fixed
    defaults (52365, 10002-19999, …), which two nodes on one machine would share."""
    fixed = {}
    for name, (_, variable) in {**RAY_PORT_SETTINGS, **WORKER_PORT_SETTINGS}.items():
        port = _port_from_env(environ, variable)
        if port is not None and (name in NODE_PORT_NAMES or name in WORKER_PORT_SETTINGS):
            fixed[name] = port
    missing = [name for name in NODE_PORT_NAMES if name not in fixed]
    candidates = [p for p in free_ports(len(missing) + len(fixed)) if p not in fixed.values()]
    chosen = {**dict(zip(missing, candidates, strict=False)), **fixed}
    flags = []
    for name in NODE_PORT_NAMES:
        flags += [f"--{RAY_PORT_SETTINGS[name][0]}", str(chosen[name])]
    for name, (flag, _) in WORKER_PORT_SETTINGS.items():
        flags += [f"--{flag}", str(chosen.get(name, 0))]
    return flags


def ray_node_command(
    head: str,
    node_rank: int,
    temp_dir: Path,
    port_flags: list[str],
    *,
    node_group: str | None = None,
    advertise: str | None = None,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
) -> list[str]:
    """`ray start --address HEAD --block` for a node joining a head: labelled with its
    node rank (and group), so placements find it; its own temp folder, since Ray would
    otherwise use the head's path, which two nodes sharing a disk would share."""
    labels = f"{NODE_RANK_LABEL}={node_rank}"
    if node_group:
        labels += f",{NODE_GROUP_LABEL}={node_group}"
    command = [
        str(BIN / "ray"), "start", "--block", "--disable-usage-stats",
        "--address", head, "--labels", labels, *port_flags, "--temp-dir", str(temp_dir),
    ]  # fmt: skip
    if advertise:
        command += ["--node-ip-address", advertise]
    if num_cpus is not None:
        command += ["--num-cpus", str(num_cpus)]
    if num_gpus is not None:
        command += ["--num-gpus", str(num_gpus)]
    return command


# Ray puts unix sockets under its temp dir, and their paths must stay within 107 bytes:
# the longest it appends, with a seven-digit pid, is
# "/session_2026-11-26_14-30-50_324275_4194304/sockets/plasma_store" (65 bytes).
RAY_SOCKET_SUFFIX_LEN = 65
MAX_RAY_TEMP_DIR_LEN = 107 - RAY_SOCKET_SUFFIX_LEN
# Ray's own folder inside a private one made under /tmp: Ray makes its temp dir
# world-writable, so the folder above it is what keeps other users out.
RAY_FOLDER_NAME = "ray"


class UnsafeFolderError(ValueError):
    """A folder for Ray's files that other local users could enter or swap; the message
    says what is wrong and what to do."""


def require_private(folder: Path, record: Path) -> None:
    """`folder`, reused, must be a real folder of this user's with mode 0700: one made
    by tempfile.mkdtemp. Else another user made it, or can enter it."""
    status = os.lstat(folder)
    mode = stat.S_IMODE(status.st_mode)
    if stat.S_ISLNK(status.st_mode):
        why = "is a symbolic link"
    elif not stat.S_ISDIR(status.st_mode):
        why = "is not a folder"
    elif status.st_uid != os.getuid():
        why = f"belongs to uid {status.st_uid}, not to you (uid {os.getuid()})"
    elif mode != 0o700:
        why = f"has mode {mode:04o}, not 0700"
    else:
        return
    raise UnsafeFolderError(
        f"Ray's files would go to {folder}, which {why}: another user could read its "
        f"logs or replace what Ray runs. Remove the link {record} and start again: a new "
        "private folder is made"
    )


def require_closed_to_others(folder: Path, temp_dir: Path) -> None:
    """Ray makes `temp_dir` world-writable: the folder holding it must be this user's,
    with no access for others (var/ is, `up` and `join` make it so)."""
    status = folder.stat()
    if status.st_uid != os.getuid() or status.st_mode & 0o077:
        raise UnsafeFolderError(
            f"Ray's folder {temp_dir} would be inside {folder} (mode "
            f"{stat.S_IMODE(status.st_mode):04o}, uid {status.st_uid}), which other users "
            "can enter, and Ray makes its folder writable by all: give one inside a folder "
            "of yours with mode 0700"
        )


def private_ray_temp_dir(preferred: Path, name: str) -> Path:
    """Ray's temp folder for `preferred` (var/ray, var/ray-node-N), made or checked.

    Ray makes its temp folder, and the session, sockets/, logs/ and runtime_resources/
    in it, writable by all: what keeps other local users from its logs (which hold
    secrets) and its cached packages is the folder above it. So it is `preferred` when
    that is short enough for Ray's socket paths (its parent, var/, is its user's only);
    else `ray` in a folder that tempfile.mkdtemp makes under /tmp (mode 0700, a name
    nobody can guess or take first), recorded as the link `preferred` so the next
    start reuses it, after checking that folder again."""
    if preferred.is_symlink():  # a folder made by an earlier start (or the user's link)
        target = Path(os.readlink(preferred))
        target = target if target.is_absolute() else preferred.parent / target
        if os.path.lexists(target.parent):
            require_private(target.parent, preferred)
            target.mkdir(exist_ok=True)
            return target
        # Its folder is gone (/tmp is emptied at boot): a new one, under a new name.
    elif len(str(preferred)) <= MAX_RAY_TEMP_DIR_LEN:
        if not preferred.parent.exists():
            preferred.parent.mkdir(parents=True, mode=0o700)
        require_closed_to_others(preferred.parent, preferred)
        preferred.mkdir(mode=0o700, exist_ok=True)
        return preferred
    base = tempfile.gettempdir()
    if len(base) + len(name) + len(RAY_FOLDER_NAME) + 11 > MAX_RAY_TEMP_DIR_LEN:
        base = "/tmp"  # TMPDIR too long for Ray's socket paths
    folder = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=base)) / RAY_FOLDER_NAME
    folder.mkdir(mode=0o700)
    link = preferred.with_name(f".{preferred.name}.{os.getpid()}")
    try:  # a link put in place at once: a start never sees half of one
        preferred.parent.mkdir(parents=True, exist_ok=True)
        link.unlink(missing_ok=True)
        link.symlink_to(folder)
        link.replace(preferred)
    except OSError as error:
        link.unlink(missing_ok=True)
        shutil.rmtree(folder.parent)
        raise UnsafeFolderError(
            f"cannot record Ray's folder {folder} as the link {preferred} "
            f"({error.strerror}); move {preferred} away"
        ) from None
    return folder


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


def dashboard_url(ports: RayHeadPorts, addresses: HeadAddresses = LOCAL) -> str:
    return f"http://{addresses.ray_local}:{ports.dashboard}"


def discard_output() -> None:
    """From now on this process's output (and its errors, when they went to the same
    pipe) goes to /dev/null: its reader is gone."""
    try:
        output = os.fstat(sys.stdout.fileno())
        errors = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    if (errors.st_dev, errors.st_ino) == (output.st_dev, output.st_ino):  # `up 2>&1 | tee`
        os.dup2(devnull, sys.stderr.fileno())
    os.close(devnull)
