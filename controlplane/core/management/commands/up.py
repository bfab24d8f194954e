"""`./armature up`: set up and run the whole control plane on this machine."""

import hashlib
import os
import shlex
import sys
import tempfile
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand
from honcho.manager import Manager

from controlplane.core.bootstrap import AdminAccount, ensure_admin, seed_demo
from controlplane.core.stack import (
    RayHeadPorts,
    dashboard_url,
    ray_head_command,
    ray_head_env,
    web_command,
    web_port,
    worker_command,
)
from controlplane.env import persistent_secret
from controlplane.runs.interruption import interrupt_active_runs

# Ray puts unix sockets under its temp dir; their paths must stay under 107 bytes.
MAX_RAY_TEMP_DIR_LEN = 60


def ray_temp_dir() -> Path:
    preferred = settings.VAR_DIR / "ray"
    if len(str(preferred)) <= MAX_RAY_TEMP_DIR_LEN:
        return preferred
    digest = hashlib.sha1(str(preferred).encode()).hexdigest()[:10]
    return Path(tempfile.gettempdir()) / f"armature-ray-{digest}"


# How long Ctrl-C waits for runs' jobs to stop cleanly (a trainer finishes its iteration
# and saves a checkpoint) before the Ray head goes down with whatever is left.
INTERRUPT_WAIT_S = 30.0


class StackManager(Manager):
    """Honcho's manager, which first interrupts the runs on the Ray head it owns: the
    head is about to stop, and its jobs with it (docs/runs.md, "Stopping the app")."""

    def __init__(self, owns_ray_head: bool) -> None:
        super().__init__()
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


class Command(BaseCommand):
    help = "Migrate, create the admin and the demo, then run web, worker and Ray until Ctrl-C."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--host", default=os.environ.get("ARMATURE_HOST", "127.0.0.1"))
        parser.add_argument(
            "--port", type=int, default=None, help="default: ARMATURE_PORT, or 8000 if free"
        )

    def handle(self, *args, host: str, port: int | None, **options) -> None:
        if port is None:
            port = web_port(os.environ)
        call_command("migrate", interactive=False, verbosity=0)
        admin = ensure_admin()
        seed_demo(owner=None)

        env = {"ARMATURE_WEB_URL": f"http://127.0.0.1:{port}"}
        ray_address = os.environ.get("RAY_ADDRESS")
        manager = StackManager(owns_ray_head=not ray_address)
        if not ray_address:
            ports = RayHeadPorts.from_environment(os.environ)
            temp_dir = ray_temp_dir()
            temp_dir.mkdir(parents=True, exist_ok=True)
            ray_address = dashboard_url(ports)
            # The head requires a token that only this user can read (var/, mode 0600).
            token = settings.RAY_AUTH_TOKEN or persistent_secret(
                settings.VAR_DIR / "ray_auth_token"
            )
            env["RAY_AUTH_TOKEN"] = settings.RAY_AUTH_TOKEN = token
            manager.add_process(
                "ray",
                shlex.join(ray_head_command(temp_dir, ports)),
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
        manager.add_process("web", shlex.join(web_command(host, port)), env=child_env)
        manager.add_process(
            "worker",
            shlex.join(worker_command(settings.VAR_DIR / "celerybeat-schedule")),
            env=child_env,
        )

        self.stdout.write(
            self.style.SUCCESS(f"\nArmature: http://{host}:{port}/  ({admin_login_hint(admin)})")
        )
        self.stdout.write(
            f"Ray: {ray_address}   Database: {settings.DATABASES['default']['ENGINE']}"
            f"   Press Ctrl-C to stop everything.\n"
        )
        self.stdout.flush()
        manager.loop()
        sys.exit(manager.returncode)
