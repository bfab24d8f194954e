"""Read-side query times on a big database: 1,000 runs, one run with 100,000 points over
ten keys, and one with 100,000 points of success counts (overall, per horizon, per
task). Each API endpoint is timed in the server (Django's test client, request to
response, median of repeats) with its payload size.

`series_queries_worst`: the slowest endpoint's time (ours) against a bare indexed
SELECT of one key's 10,000 raw points on the same database (baseline: what reading a
single series costs before any bucketing or JSON). Target: every endpoint < 100 ms.

Needs PostgreSQL; by default the database `armature_series_q` on 127.0.0.1:5432
(override with DATABASE_URL). It is migrated and its bench rows removed at the end.

    python bench/series_queries.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pg_database import ensure_database  # noqa: E402

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/armature_series_q"
STEPS = 10_000
KEYS = [f"losses/k{i}" for i in range(8)] + ["charts/env_steps", "rollout/success_rate"]
COUNT_STEPS = 5_000
HORIZONS = (5, 10, 15)
TASKS = range(6)


def set_up(var_dir: Path) -> None:
    database_url = os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL)
    ensure_database(database_url)
    os.environ.update(
        ARMATURE_VAR_DIR=str(var_dir),
        DJANGO_SETTINGS_MODULE="controlplane.settings",
        ALLOWED_HOSTS="testserver",
        DATABASE_URL=database_url,
    )
    os.environ.pop("REDIS_URL", None)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)


def count_keys() -> list[str]:
    scopes = [""] + [f"h{h}/" for h in HORIZONS] + [f"task{t}/" for t in TASKS]
    return [f"counts/{scope}{what}" for scope in scopes for what in ("episodes", "successes")]


def build():
    """1,000 runs with a success point each, the big run and the counts run."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from controlplane.experiments.services import create_experiment
    from controlplane.runs import metric_points, series
    from controlplane.runs.models import MetricKey, Run, RunState

    user = get_user_model().objects.create_superuser(f"bench-q-{os.getpid()}", password="x")
    experiment = create_experiment(f"bench-q-{os.getpid()}", "algorithm: {name: ppo}\n")
    now = timezone.now()
    states = [RunState.SUCCEEDED, RunState.RUNNING, RunState.FAILED]
    runs = Run.objects.bulk_create(
        Run(
            experiment=experiment, revision=experiment.latest_revision,
            config_yaml="algorithm: {name: ppo}\n", state=states[i % 3], created_by=user,
            tags=["odd"] if i % 2 else [], started_at=now - timezone.timedelta(seconds=i),
            finished_at=now,
        )
        for i in range(1000)
    )  # fmt: skip
    keys = MetricKey.objects.bulk_create(
        MetricKey(run=run, name=series.OVERALL_SUCCESS_KEY) for run in runs
    )
    metric_points.copy_points([(key.pk, 1, (i % 100) / 100, 1.7e9) for i, key in enumerate(keys)])
    rng = random.Random(0)
    big, counted = runs[0], runs[1]
    ids = metric_points.key_ids(big.pk, KEYS)
    rows = [
        (ids[name], step, float(step * 512) if name == "charts/env_steps" else rng.random(),
         1.7e9 + step)
        for step in range(STEPS) for name in KEYS
    ]  # fmt: skip
    ids = metric_points.key_ids(counted.pk, [*count_keys(), "charts/env_steps"])
    for step in range(COUNT_STEPS):
        for name in count_keys():
            episodes = 16.0
            value = episodes if name.endswith("episodes") else float(rng.randint(0, 16))
            rows.append((ids[name], step, value, 1.7e9 + step))
    for start in range(0, len(rows), 50_000):
        metric_points.copy_points(rows[start : start + 50_000])
    return user, experiment, big, counted


def timed(client, url: str, repeats: int) -> tuple[float, int]:
    times, size = [], 0
    for _ in range(repeats):
        started = time.perf_counter()
        response = client.get(url)
        times.append(time.perf_counter() - started)
        assert response.status_code == 200, (url, response.content[:300])
        size = len(response.content)
    return statistics.median(times) * 1000, size


def bare_select(key_id: int, repeats: int) -> float:
    from django.db import connection

    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT step, value, wall_time FROM runs_metricpoint WHERE key_id = %s "
                "ORDER BY step",
                [key_id],
            )
            cursor.fetchall()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    set_up(Path(tempfile.mkdtemp(prefix="armature-bench-")))
    from rest_framework.test import APIClient

    from controlplane.runs.models import MetricKey, MetricPoint, Run

    user, experiment, big, counted = build()
    client = APIClient()
    client.force_authenticate(user)
    b, c, n = big.pk, counted.pk, experiment.name
    endpoints = {
        "runs list": "/api/v1/runs?page_size=50",
        "runs by success": "/api/v1/runs?ordering=-success&page_size=50",
        "runs by duration": "/api/v1/runs?ordering=duration&page_size=50",
        "runs filtered": f"/api/v1/runs?tag=odd&state=running&experiment={n}&page_size=50",
        "runs page 5": "/api/v1/runs?page=5&page_size=50",
        "series one key": f"/api/v1/runs/{b}/series?keys=losses/k0&buckets=1000",
        "series nine keys": f"/api/v1/runs/{b}/series?keys=losses/*,charts/env_steps&buckets=1000",
        "series x=env_steps": f"/api/v1/runs/{b}/series?keys=losses/k0&x=env_steps&buckets=1000",
        "series x=wall_time": f"/api/v1/runs/{b}/series?keys=losses/k0&x=wall_time&buckets=1000",
        "series step range": f"/api/v1/runs/{b}/series?keys=losses/k0&start=2000&end=4000",
        "latest": f"/api/v1/runs/{b}/latest",
        "success": f"/api/v1/runs/{c}/success?buckets=1000",
    }
    try:
        for url in endpoints.values():
            client.get(url)  # warm caches and plans
        results = {name: timed(client, url, args.repeats) for name, url in endpoints.items()}
        key = MetricKey.objects.get(run=big, name="losses/k0").pk
        baseline = bare_select(key, args.repeats)
    finally:
        MetricPoint.objects.filter(key__run__experiment=experiment).delete()
        MetricKey.objects.filter(run__experiment=experiment).delete()
        Run.objects.filter(experiment=experiment).delete()
        experiment.delete()
        user.delete()
    for name, (ms, size) in results.items():
        flag = "" if ms < 100 else "  (over 100 ms)"
        print(f"{name:20s} {ms:7.1f} ms {size / 1000:7.1f} kB{flag}")
    print(f"{'bare SELECT 10k pts':20s} {baseline:7.1f} ms")
    worst_name, (worst, _) = max(results.items(), key=lambda item: item[1][0])
    print(f"slowest: {worst_name}")
    print(
        f"RESULT bench=series_queries_worst ours={worst:.1f} baseline={baseline:.1f} "
        f"ratio={worst / baseline:.2f} unit=ms better=lower"
    )


if __name__ == "__main__":
    main()
