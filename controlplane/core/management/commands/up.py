"""`./armature up`: set up and run the whole control plane on this machine."""

import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.http.request import split_domain_port, validate_host
from honcho.manager import Manager
from honcho.printer import Message, Printer

from controlplane.core.bootstrap import AdminAccount, ensure_admin, seed_demo
from controlplane.core.stack import (
    AddressError,
    HeadAddresses,
    RayHeadPorts,
    UnsafeFolderError,
    dashboard_url,
    discard_output,
    private_ray_temp_dir,
    ray_head_command,
    ray_head_env,
    web_command,
    web_port,
    worker_command,
)
from controlplane.env import persistent_secret
from controlplane.runs.interruption import interrupt_active_runs


def ray_temp_dir() -> Path:
    """The local head's Ray folder, made or checked (stack.private_ray_temp_dir)."""
    try:
        return private_ray_temp_dir(Path(settings.VAR_DIR).absolute() / "ray", "armature-ray")
    except UnsafeFolderError as error:
        raise CommandError(str(error)) from None
    except OSError as error:
        message = f"cannot make Ray's folder ({error.filename}: {error.strerror})"
        raise CommandError(message) from None


def web_url(environ: Mapping[str, str], addresses: HeadAddresses, port: int) -> str:
    """Where trainers and the worker reach the web server: ARMATURE_WEB_URL when set (a
    proxy's name, say), else the advertised address and the port."""
    configured = environ.get("ARMATURE_WEB_URL", "").strip().rstrip("/")
    if not configured:
        return addresses.web_url(port)
    parts = urlsplit(configured)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CommandError(
            f"ARMATURE_WEB_URL={configured!r} is not an http:// or https:// URL with a host "
            "(e.g. http://10.0.0.5:8000): trainers on every node report there"
        )
    return configured


def allowed_hosts(environ: Mapping[str, str], url: str, addresses: HeadAddresses) -> str | None:
    """ALLOWED_HOSTS for web and worker: without the setting, the defaults plus the hosts
    others use (the web URL's, the advertised address), or the web server would refuse
    the trainers' reports (400). A set one is kept, and must admit the web URL's host."""
    host = urlsplit(url).netloc
    if "ALLOWED_HOSTS" in environ:
        if not validate_host(split_domain_port(host)[0], settings.ALLOWED_HOSTS):
            raise CommandError(
                f"ALLOWED_HOSTS={environ['ALLOWED_HOSTS']!r} does not admit {host}, the host "
                f"of the web URL ({url}): the web server would refuse the trainers' reports; "
                "add it to ALLOWED_HOSTS"
            )
        return None
    needed = [split_domain_port(host)[0], addresses.advertise]
    missing = [name for name in needed if not validate_host(name, settings.ALLOWED_HOSTS)]
    if not missing:  # one machine: the defaults, untouched
        return None
    return ",".join(dict.fromkeys([*settings.ALLOWED_HOSTS, *missing]))


# How long Ctrl-C waits for runs' jobs to stop cleanly (a trainer finishes its iteration
# and saves a checkpoint) before the Ray head goes down with whatever is left.
INTERRUPT_WAIT_S = 30.0


class PipeTolerantPrinter(Printer):
    """Honcho's printer, for output whose reader may stop first. Ctrl-C reaches the
    terminal's whole foreground job: in `./armature up 2>&1 | tee up.log` tee exits too,
    and the lines of the shutdown that follows ("SIGINT received", "sending SIGTERM to
    …") meet a closed pipe. A failed write must not stop that shutdown (web, worker and
    Ray would be left running): the output is dropped from then on."""

    def write(self, message: Message) -> None:
        try:
            super().write(message)
        except OSError:  # BrokenPipeError (EPIPE), or EIO from a closed terminal
            discard_output()


class StackManager(Manager):
    """Honcho's manager, which first interrupts the runs on the Ray head it owns: the
    head is about to stop, and its jobs with it (docs/runs.md, "Stopping the app")."""

    def __init__(self, owns_ray_head: bool) -> None:
        super().__init__(printer=PipeTolerantPrinter(sys.stdout))
        self.owns_ray_head = owns_ray_head
        self._interrupted = False

    def terminate(self) -> None:
        if self.owns_ray_head and not self._interrupted:
            self._interrupted = True  # a second Ctrl-C goes straight on
            self._system_print("stopping active runs (they can be resumed)\n")
            try:
                stopped = interrupt_active_runs(
                    "the control plane was stopped (Ctrl-C); resume to continue",
                    INTERRUPT_WAIT_S,
                )
            except Exception as error:  # shutting down must go on whatever happens
                self._system_print(f"could not interrupt runs: {error}\n")
            else:
                if stopped:
                    self._system_print(f"interrupted runs: {stopped}\n")
        super().terminate()


def admin_login_hint(admin: AdminAccount) -> str:
    """How to log in: the password itself only at the start that set it."""
    if admin.password is not None:
        kept = (
            f"; also in {admin.password_file}, readable only by you"
            if admin.password_file.exists()
            else ""
        )
        return f"log in as {admin.username} / {admin.password}{kept}"
    if admin.password_file.exists():
        return f"log in as {admin.username}; its password is in {admin.password_file}"
    return (
        f"log in as {admin.username} with the password set at the first start; "
        "./armature reset-admin-password sets a new one"
    )


def keep_private(var_dir: Path) -> None:
    """What this stack writes is its user's alone: the database (sessions, password
    hashes), the broker, logs, run folders, Ray's files. On a shared machine other
    local users can reach loopback ports but not read this user's folder."""
    os.umask(0o077)  # inherited by every process the stack starts
    var_dir.mkdir(parents=True, exist_ok=True)
    var_dir.chmod(0o700)


class Command(BaseCommand):
    help = "Migrate, create the admin and the demo, then run web, worker and Ray until Ctrl-C."

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--bind", "--host", dest="bind", metavar="ADDR",
            default=os.environ.get("ARMATURE_HOST", "127.0.0.1"),
            help="address the web server listens on, and Ray's dashboard when other nodes "
            "join (default: ARMATURE_HOST, or 127.0.0.1; 0.0.0.0: every interface)",
        )  # fmt: skip
        parser.add_argument(
            "--advertise", metavar="ADDR", default=os.environ.get("ARMATURE_ADVERTISE") or None,
            help="address other machines reach this one at: Ray's node address, which "
            "`./armature join` dials, and the web URL's host (default: ARMATURE_ADVERTISE, "
            "or the --bind address; loopback for 0.0.0.0). docs/multi-node.md",
        )  # fmt: skip
        parser.add_argument(
            "--port", type=int, default=None, help="default: ARMATURE_PORT, or 8000 if free"
        )

    def handle(self, *args, bind: str, advertise: str | None, port: int | None, **options) -> None:
        try:  # before anything starts: a wrong address is a typo to fix, not to run with
            addresses = HeadAddresses.choose(bind, advertise)
        except AddressError as error:
            raise CommandError(str(error)) from None
        keep_private(settings.VAR_DIR)
        ray_address = os.environ.get("RAY_ADDRESS")
        temp_dir = None if ray_address else ray_temp_dir()  # refused before anything starts
        if port is None:
            port = web_port(os.environ)
        url = web_url(os.environ, addresses, port)
        hosts = allowed_hosts(os.environ, url, addresses)
        call_command("migrate", interactive=False, verbosity=0)
        admin = ensure_admin()
        seed_demo(owner=None)

        env = {"ARMATURE_WEB_URL": url, **({"ALLOWED_HOSTS": hosts} if hosts else {})}
        manager = StackManager(owns_ray_head=not ray_address)
        join_hint = ""
        if temp_dir is not None:
            ports = RayHeadPorts.from_environment(os.environ)
            ray_address = dashboard_url(ports, addresses)
            # The head requires a token that only this user can read (var/, mode 0600).
            token = settings.RAY_AUTH_TOKEN or persistent_secret(
                settings.VAR_DIR / "ray_auth_token"
            )
            if not token:  # Ray would start the head with its checks off
                raise CommandError("no Ray token: the head would start with its checks off")
            env["RAY_AUTH_TOKEN"] = settings.RAY_AUTH_TOKEN = token
            if addresses.serves_other_nodes:
                token_from = (
                    "with the same RAY_AUTH_TOKEN"
                    if os.environ.get("RAY_AUTH_TOKEN")
                    else f"--token-file <a copy of {settings.VAR_DIR / 'ray_auth_token'}>"
                )
                join_hint = (
                    f"Other nodes join with: ./armature join {addresses.advertise}:{ports.gcs} "
                    f"--node-rank N {token_from}\n"
                )
            manager.add_process(
                "ray",
                shlex.join(
                    [
                        sys.executable,
                        "-m",
                        "controlplane.core.head_keeper",
                        *ray_head_command(temp_dir, ports, addresses=addresses),
                    ]
                ),
                # Ray can only stop a job once it has placed it: it fails the ones it
                # cannot place when the control plane gives up on them too.
                env={
                    **os.environ,
                    **ray_head_env(token),
                    "RAY_JOB_START_TIMEOUT_SECONDS": str(int(settings.ARMATURE_PENDING_TIMEOUT_S)),
                },  # fmt: skip
            )
        env["RAY_ADDRESS"] = ray_address
        settings.RAY_ADDRESS = ray_address  # this process stops the runs at Ctrl-C
        settings.ARMATURE_WEB_URL = env["ARMATURE_WEB_URL"]  # and tells browsers so
        child_env = {**os.environ, **env}
        manager.add_process("web", shlex.join(web_command(addresses.bind, port)), env=child_env)
        manager.add_process(
            "worker",
            shlex.join(worker_command(settings.VAR_DIR / "celerybeat-schedule")),
            env=child_env,
        )

        self.stdout.write(self.style.SUCCESS(f"\nArmature: {url}/  ({admin_login_hint(admin)})"))
        self.stdout.write(
            f"Ray: {ray_address}   Database: {settings.DATABASES['default']['ENGINE']}"
            f"   Press Ctrl-C to stop everything.\n{join_hint}"
        )
        self.stdout.flush()
        manager.loop()
        sys.exit(manager.returncode)
