"""`./armature up` on a fresh var/: the UI comes up with every component healthy and a
demo to launch, and Ctrl-C leaves no process behind (Ray included)."""

import contextlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from django.conf import settings

from tests.processes import free_port, pids_with_env, wait_until

pytestmark = [pytest.mark.timeout(420), pytest.mark.embedded, pytest.mark.embedded_only]


def healthz(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=10) as response:
            return json.load(response)
    except urllib.error.HTTPError as exc:
        return json.load(exc)
    except OSError:
        return None


def wait_for_stack(url: str, timeout_s: float, log_path) -> dict:
    """The health report once every component is up; a timeout says which were not and
    shows the end of `up`'s log."""
    reports: list[dict | None] = [None]

    def all_up() -> bool:
        reports.append(healthz(url))
        return bool(reports[-1]) and reports[-1]["status"] == "up"

    try:
        wait_until(all_up, timeout_s, "every component up", poll_s=2)
    except TimeoutError:
        log_tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-60:])
        pytest.fail(
            f"the stack is not up after {timeout_s} s: {reports[-1]}\nup's log:\n{log_tail}"
        )
    return reports[-1]


# `./armature up 2>&1 | tee up.log` as a shell runs it: both in a process group of their
# own (the terminal's foreground job), the shell outside it. argv: the log, then `up`.
UP_PIPED_INTO_TEE = """
import subprocess, sys
up = subprocess.Popen(sys.argv[2:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                      process_group=0)
tee = subprocess.Popen(["tee", sys.argv[1]], stdin=up.stdout, stdout=subprocess.DEVNULL,
                       process_group=up.pid)
up.stdout.close()
print(up.pid, flush=True)
tee.wait()
sys.exit(up.wait())
"""


def test_up_runs_everything_and_ctrl_c_stops_everything_piped_into_tee(tmp_path):
    """`./armature up 2>&1 | tee up.log`: every component comes up, with a demo to launch.
    Ctrl-C reaches the whole foreground job, tee too: `up` then writes its shutdown lines
    into a pipe nobody reads, and must stop the stack all the same."""
    # Ray's fixed default ports, taken (as by another Ray head): up chooses others.
    held = hold_ports([10001, 52365])
    var_dir = tmp_path / "var"
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "REDIS_URL", "RAY_ADDRESS", "DJANGO_SETTINGS_MODULE"}
    }
    ray_dashboard = free_port()
    env.update(
        ARMATURE_VAR_DIR=str(var_dir),
        ARMATURE_ADMIN_PASSWORD="admin-pw-for-tests",
        ARMATURE_RAY_PORT=str(free_port()),
        ARMATURE_RAY_DASHBOARD_PORT=str(ray_dashboard),
    )
    log_path = tmp_path / "up.log"
    up = [sys.executable, "manage.py", "up", "--port", str(port)]
    shell = subprocess.Popen(
        [sys.executable, "-c", UP_PIPED_INTO_TEE, str(log_path), *up],
        cwd=settings.BASE_DIR, env=env, stdout=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    job = int(shell.stdout.readline())  # the foreground job's process group

    def running() -> list[int]:
        return pids_with_env("ARMATURE_VAR_DIR", str(var_dir))

    url = f"http://127.0.0.1:{port}"
    try:
        report = wait_for_stack(url, 240, log_path)
        output = log_path.read_text()
        assert f"Armature: http://127.0.0.1:{port}/" in output
        assert "log in as admin / admin-pw-for-tests" in output
        assert report["checks"]["ray"] == {"up": True}  # anonymous: no topology
        # Ray's token authentication is on: the health check above sent the token; a
        # request without it is refused, and the token is readable by this user only.
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{ray_dashboard}/api/jobs/", timeout=10)
        assert refused.value.code == 401
        assert (var_dir / "ray_auth_token").stat().st_mode & 0o777 == 0o600
        # The rest of var/ is this user's alone too: the folder itself, and what the
        # stack writes there (the database holds sessions and password hashes).
        assert var_dir.stat().st_mode & 0o777 == 0o700
        for name in ("armature.sqlite3", "secret_key"):
            mode = (var_dir / name).stat().st_mode
            assert mode & 0o077 == 0, (name, oct(mode))
        # Ray's files: var/ is too deep here for Ray's socket paths, so they are in a
        # folder of this user's alone under /tmp, linked from var/ray (Ray makes its own
        # folder, the one inside, writable by all).
        private = ray_folder_made_for(var_dir).lstat()
        assert private.st_mode & 0o777 == 0o700 and private.st_uid == os.getuid()

        with sqlite3.connect(var_dir / "armature.sqlite3") as db:
            names = db.execute("select name from experiments_experiment order by name")
            assert names.fetchall() == [
                ("demo-builtin-ppo",),
                ("demo-console",),
                ("demo-pi0",),
                ("demo-vla",),
            ]
            assert db.execute("select name from inventory_cluster").fetchall() == [("one-machine",)]
            assert db.execute(
                "select is_superuser from auth_user where username='admin'"
            ).fetchone() == (1,)
        assert len(running()) >= 6  # the shell, up, tee, web, worker, Ray

        os.killpg(job, signal.SIGINT)  # what Ctrl-C in the terminal does
        try:
            wait_until(lambda: not running(), 60, "every process to exit")
        except TimeoutError:
            left = {pid: command_line(pid) for pid in running()}
            tail = log_path.read_text(errors="replace")[-3000:]
            pytest.fail(f"still running 60 s after Ctrl-C: {left}\nup's log:\n{tail}")
        assert shell.wait(10) != 0
    finally:
        for pid in running():  # what this test started, left by a failure
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shell.wait(30)
        for sock in held:
            sock.close()
        if (var_dir / "ray").is_symlink():
            shutil.rmtree(ray_folder_made_for(var_dir), ignore_errors=True)


def ray_folder_made_for(var_dir: Path) -> Path:
    """The private folder under /tmp that `up` made for Ray's files (var/ray links to
    Ray's folder in it)."""
    return Path(os.readlink(var_dir / "ray")).parent


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
    except OSError:
        return "?"


def hold_ports(ports: list[int]) -> list[socket.socket]:
    """Listen on each port that is free (one someone else holds is taken all the same)."""
    held = []
    for port in ports:
        sock = socket.socket()
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            sock.close()
            continue
        sock.listen()
        held.append(sock)
    return held


def start_up(var_dir, port: int, env: dict, log_path) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "manage.py", "up", "--port", str(port)],
            cwd=settings.BASE_DIR, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip


def run_row(var_dir, run_id: int) -> dict:
    with sqlite3.connect(var_dir / "armature.sqlite3") as db:
        db.row_factory = sqlite3.Row
        row = db.execute("select * from runs_run where id = ?", (run_id,)).fetchone()
        return dict(row) if row else {}


def run_story(var_dir, run_id: int, log_path) -> str:
    """What a failure needs to say: the run's row, its events and the end of `up`'s log."""
    with sqlite3.connect(var_dir / "armature.sqlite3") as db:
        events = db.execute(
            "select kind, message from runs_runevent where run_id = ? order by id", (run_id,)
        ).fetchall()
    log_tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-60:])
    return f"run: {run_row(var_dir, run_id)}\nevents: {events}\nup's log:\n{log_tail}"


def wait_for_end(var_dir, run_id: int, timeout_s: float, log_path) -> dict:
    """The run's row once it has left the active states; a timeout tells its story."""
    active = {"queued", "submitting", "running"}
    try:
        wait_until(lambda: run_row(var_dir, run_id)["state"] not in active, timeout_s, "", 1)
    except TimeoutError:
        pytest.fail(
            f"the run is still active after {timeout_s} s\n" + run_story(var_dir, run_id, log_path)
        )
    return run_row(var_dir, run_id)


ITERATIONS = 20


def metrics_lines(var_dir, run_id: int) -> list[dict]:
    path = var_dir / "artifacts" / f"run-{run_id}" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.timeout(600)
def test_ctrl_c_interrupts_a_running_run_leaving_no_trainer_and_it_resumes_after_restart(
    tmp_path,
):
    from tests.web_session import WebSession

    var_dir = tmp_path / "var"
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "REDIS_URL", "RAY_ADDRESS", "DJANGO_SETTINGS_MODULE",
                     "ARMATURE_ADMIN_PASSWORD"}
    }  # fmt: skip
    env.update(
        ARMATURE_VAR_DIR=str(var_dir),
        ARMATURE_RAY_PORT=str(free_port()),
        ARMATURE_RAY_DASHBOARD_PORT=str(free_port()),
    )
    url = f"http://127.0.0.1:{port}"
    up = start_up(var_dir, port, env, tmp_path / "up.log")
    try:
        wait_for_stack(url, 240, tmp_path / "up.log")
        web = WebSession(url)
        web.login("admin", (var_dir / "admin_password").read_text().strip())
        # Long enough to be running at Ctrl-C, short enough to finish soon after resuming.
        status, run = web.api(
            "POST",
            "runs",
            {"experiment": "demo-builtin-ppo", "overrides": [f"runner.iterations={ITERATIONS}"]},
        )
        assert status == 201, run
        run_id = run["id"]
        wait_until(lambda: len(metrics_lines(var_dir, run_id)) >= 2, 120, "two iterations", 0.5)
        assert run_row(var_dir, run_id)["state"] == "running"
    finally:
        up.send_signal(signal.SIGINT)  # what Ctrl-C sends
        up.wait(90)
    wait_until(
        lambda: not pids_with_env("ARMATURE_VAR_DIR", str(var_dir)), 30, "every process to exit"
    )
    interrupted = run_row(var_dir, run_id)
    assert interrupted["state"] == "interrupted", interrupted
    assert "Ctrl-C" in interrupted["exit_reason"]
    done = len(metrics_lines(var_dir, run_id))
    checkpoints = var_dir / "artifacts" / f"run-{run_id}" / "checkpoints"
    assert (checkpoints / f"iter_{done:06d}.pt").exists()  # saved on the way out

    up = start_up(var_dir, port, env, tmp_path / "up-again.log")
    try:
        wait_for_stack(url, 240, tmp_path / "up-again.log")
        web = WebSession(url)
        web.login("admin", (var_dir / "admin_password").read_text().strip())
        status, resumed = web.api("POST", f"runs/{run_id}/resume")
        assert status == 202, resumed
        assert resumed["attempt"] == 2
        finished = wait_for_end(var_dir, run_id, 240, tmp_path / "up-again.log")
        assert finished["state"] == "succeeded", run_story(
            var_dir, run_id, tmp_path / "up-again.log"
        )
        iterations = [line["iteration"] for line in metrics_lines(var_dir, run_id)]
        assert iterations == list(range(1, ITERATIONS + 1))  # continued from the checkpoint, no gap
        with sqlite3.connect(var_dir / "armature.sqlite3") as db:
            attempts = db.execute(
                "select distinct attempt from runs_telemetrybatch where run_id = ?", (run_id,)
            ).fetchall()
            stopped = db.execute(
                "select count(*) from runs_runevent where run_id = ? and kind = 'stopped'",
                (run_id,),
            ).fetchone()
        assert sorted(attempts) == [(1,), (2,)] and stopped == (1,)
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(90)
    wait_until(
        lambda: not pids_with_env("ARMATURE_VAR_DIR", str(var_dir)), 30, "every process to exit"
    )
