"""`./armature up` on a fresh var/: the UI comes up with every component healthy and a
demo to launch, and Ctrl-C leaves no process behind (Ray included)."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from django.conf import settings

from tests.processes import free_port, pids_with_env, wait_until

pytestmark = pytest.mark.timeout(300)


def healthz(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=10) as response:
            return json.load(response)
    except urllib.error.HTTPError as exc:
        return json.load(exc)
    except OSError:
        return None


def test_up_runs_everything_and_ctrl_c_stops_everything(tmp_path):
    var_dir = tmp_path / "var"
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "REDIS_URL", "RAY_ADDRESS", "DJANGO_SETTINGS_MODULE"}
    }
    env.update(
        ARMATURE_VAR_DIR=str(var_dir),
        ARMATURE_ADMIN_PASSWORD="admin-pw-for-tests",
        ARMATURE_RAY_PORT=str(free_port()),
        ARMATURE_RAY_DASHBOARD_PORT=str(free_port()),
    )
    log_path = tmp_path / "up.log"
    with open(log_path, "wb") as log:
        up = subprocess.Popen(
            [sys.executable, "manage.py", "up", "--port", str(port)],
            cwd=settings.BASE_DIR, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        reports = []

        def all_up() -> bool:
            reports.append(healthz(url))
            return bool(reports[-1]) and reports[-1]["status"] == "up"

        wait_until(all_up, 150, "every component up", poll_s=2)
        output = log_path.read_text()
        assert f"Armature: http://127.0.0.1:{port}/" in output
        assert "log in as admin / admin-pw-for-tests" in output
        assert reports[-1]["checks"]["ray"] == {"up": True}  # anonymous: no topology

        with sqlite3.connect(var_dir / "armature.sqlite3") as db:
            assert db.execute("select name from experiments_experiment").fetchall() == [
                ("demo-builtin-ppo",)
            ]
            assert db.execute("select name from inventory_cluster").fetchall() == [("one-machine",)]
            assert db.execute(
                "select is_superuser from auth_user where username='admin'"
            ).fetchone() == (1,)
        assert len(pids_with_env("ARMATURE_VAR_DIR", str(var_dir))) >= 4  # web, worker, Ray
    finally:
        up.send_signal(signal.SIGINT)  # what Ctrl-C sends
        up.wait(60)

    wait_until(
        lambda: not pids_with_env("ARMATURE_VAR_DIR", str(var_dir)), 30, "every process to exit"
    )
