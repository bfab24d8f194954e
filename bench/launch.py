"""Launch latency: from `POST /api/v1/runs` to the trainer's first reported iteration,
against the floor of a bare Ray job submission (`echo`) timed from submit to finish on
the same Ray head in the same run (`launch`).

`launch_torch_floor` compares the same launch with what any torch trainer pays before
its first update: a bare Ray job that imports torch and takes one optimiser step
(torch imports its compiler stack, `torch._dynamo`, on the first optimiser call),
submit → finished. The stages of our launch (API → submitted → trainer started →
first iteration) are printed from the run's own timestamps.

It starts a Ray head, the web server and a Celery worker of its own (the commands of
`./armature up`) on free ports, with an SQLite database and the file-system broker in
a temporary folder, and stops them all at the end.

    python bench/launch.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from controlplane.core.stack import (  # noqa: E402
    RAY_HEAD_ENV,
    RayHeadPorts,
    dashboard_url,
    ray_head_command,
    web_command,
    worker_command,
)
from tests.processes import free_port, http_ok, start, stop, wait_until  # noqa: E402

ITERATIONS = 2


def api(url: str, token: str, method: str = "GET", body: dict | None = None) -> dict:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def set_up(var_dir: Path) -> str:
    """Migrate, create an admin token and the demo experiment; return the token."""
    os.environ.update(ARMATURE_VAR_DIR=str(var_dir), DJANGO_SETTINGS_MODULE="controlplane.settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from controlplane.api.tokens import create_token
    from controlplane.core.bootstrap import seed_demo

    call_command("migrate", interactive=False, verbosity=0)
    user = get_user_model().objects.create_superuser("bench", password="bench-only")
    seed_demo(owner=user)
    return create_token(user, "bench")[1]


TORCH_FLOOR = (
    f"{sys.executable} -c 'import torch; m = torch.nn.Linear(4, 4); "
    "o = torch.optim.Adam(m.parameters()); m(torch.zeros(1, 4)).sum().backward(); o.step()'"
)


def time_launch(base: str, token: str, stages: list[dict] | None = None) -> float:
    started = time.perf_counter()
    run = api(
        f"{base}/api/v1/runs", token, "POST",
        {"experiment": "demo-builtin-ppo", "overrides": [f"runner.iterations={ITERATIONS}"]},
    )  # fmt: skip

    def first_iteration() -> bool:
        return bool(api(f"{base}/api/v1/runs/{run['id']}/metrics", token)["latest"])

    wait_until(first_iteration, 180, "the trainer's first iteration", poll_s=0.05)
    elapsed = time.perf_counter() - started
    wait_until(
        lambda: api(f"{base}/api/v1/runs/{run['id']}", token)["state"] == "succeeded",
        180, "the run to finish", poll_s=0.2,
    )  # fmt: skip
    if stages is not None:
        stages.append(api(f"{base}/api/v1/runs/{run['id']}", token) | {"total": elapsed})
    return elapsed


def stage_seconds(run: dict) -> str:
    """Seconds from the API's creation of the run to its submission to Ray, to the
    trainer's `started` report, and to the first iteration."""
    from datetime import datetime

    def at(field: str) -> float:
        return datetime.fromisoformat(run[field]).timestamp()

    created = at("created_at")
    submitted, started = at("submitted_at") - created, at("started_at") - created
    return (
        f"submitted {submitted:.2f} s, trainer started {started:.2f} s, first iteration "
        f"{run['total']:.2f} s after the POST"
    )


def time_job(ray_url: str, entrypoint: str = "echo armature") -> float:
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(ray_url)
    started = time.perf_counter()
    job = client.submit_job(entrypoint=entrypoint)
    wait_until(lambda: client.get_job_status(job).is_terminal(), 120, entrypoint, 0.05)
    elapsed = time.perf_counter() - started
    if client.get_job_status(job) != JobStatus.SUCCEEDED:
        raise RuntimeError(f"{entrypoint} failed: {client.get_job_logs(job)[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="armature-bench-"))
    token = set_up(work / "var")
    ports = RayHeadPorts.choose()
    ray_url = dashboard_url(ports)
    web_port = free_port()
    base = f"http://127.0.0.1:{web_port}"
    env = {**os.environ, "RAY_ADDRESS": ray_url, "ARMATURE_WEB_URL": base}
    ray_dir = Path(tempfile.mkdtemp(prefix="armray-"))
    processes = [
        start(ray_head_command(ray_dir, ports), {**env, **RAY_HEAD_ENV}, work / "ray.log"),
        start(web_command("127.0.0.1", web_port), env, work / "web.log"),
        start(worker_command(work / "beat-schedule"), env, work / "worker.log"),
    ]
    try:
        wait_until(lambda: http_ok(f"{ray_url}/api/version"), 90, "Ray")
        wait_until(lambda: http_ok(f"{base}/healthz"), 60, "the web server")
        time_job(ray_url)  # warm-up: the first job pays for Ray's runtime-env agent
        time_launch(base, token)
        stages: list[dict] = []
        ours = [time_launch(base, token, stages) for _ in range(args.repeats)]
        floor = [time_job(ray_url) for _ in range(args.repeats)]
        torch_floor = [time_job(ray_url, TORCH_FLOOR) for _ in range(args.repeats)]
    finally:
        for process in reversed(processes):
            stop(process)
    ours_s, floor_s = statistics.median(ours), statistics.median(floor)
    torch_s = statistics.median(torch_floor)
    for run in stages:
        print(f"run {run['id']}: {stage_seconds(run)}")
    print(f"API POST -> first trainer iteration: median {ours_s:.2f} s over {args.repeats}")
    print(f"bare Ray job (echo), submit -> done:  median {floor_s:.2f} s over {args.repeats}")
    print(f"Ray job: import torch + one Adam step: median {torch_s:.2f} s over {args.repeats}")
    for name, baseline in (("launch", floor_s), ("launch_torch_floor", torch_s)):
        print(
            f"RESULT bench={name} ours={ours_s:.3f} baseline={baseline:.3f} "
            f"ratio={ours_s / baseline:.2f} unit=s better=lower"
        )


if __name__ == "__main__":
    main()
