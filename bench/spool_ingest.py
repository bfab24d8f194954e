"""Spool ingest: how fast the control plane takes in what a trainer left in its link
spool (`controlplane.runs.spool_ingest.ingest_spools`), on PostgreSQL.

The spool is what a trainer whose link was down writes: per iteration one metrics
message of 40 values (losses, rollout, charts, per-task counts), one progress message,
and a checkpoint event every 10 iterations, between `started`/`placed` and `finished`;
every line signed with the attempt's spool key by the trainer's own `Spool`. Each repeat
takes it in for a fresh run (every message new), timed from the call to its return.

Baseline, same spool, same run: the one-message-at-a-time path ingest had before it was
made bulk (each line verified the same way, then parsed and stored with its own
`telemetry.record` call, a transaction each). For context each repeat also times a bare
`COPY` of the spool's points in one transaction (no parsing, no other rows): the floor.

Needs PostgreSQL: by default the database `armature_series` on 127.0.0.1:5432, created
when missing (override with DATABASE_URL). Its bench rows are removed at the end.

    python bench/spool_ingest.py [--repeats 3] [--iterations 5000] [--values 40]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pg_database import ensure_database  # noqa: E402

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/armature_series"
SPOOL_MIB = 512  # the trainer's default spool bound (ARMATURE_LINK_SPOOL_MB)


def set_up(var_dir: Path) -> None:
    database_url = os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL)
    ensure_database(database_url)
    os.environ.update(
        ARMATURE_VAR_DIR=str(var_dir),
        ARTIFACTS_DIR=str(var_dir / "artifacts"),
        DJANGO_SETTINGS_MODULE="controlplane.settings",
        DATABASE_URL=database_url,
    )
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)


def iteration_values(step: int, count: int) -> dict[str, float]:
    """`count` values named as a trainer names them."""
    names = ["losses/value_loss", "losses/policy_loss", "losses/entropy", "losses/approx_kl",
             "rollout/success_rate", "rollout/episode_length", "charts/SPS",
             "charts/learning_rate"]  # fmt: skip
    names += [f"counts/task{t}/h{h}/{kind}" for t in range(10) for h in (5, 10)
              for kind in ("episodes", "successes")]  # fmt: skip
    return {name: (step * 31 + i) % 997 / 997 for i, name in enumerate(names[:count])}


def write_spool(run_id: int, iterations: int, values: int) -> tuple[Path, int]:
    """The spool a trainer of the run's attempt 1 leaves; (its path, messages)."""
    from controlplane.runs.artifacts import run_artifact_dir
    from controlplane.runs.tokens import make_spool_key
    from trainer.link.protocol import Event, Metrics, Progress
    from trainer.link.spool import SPOOL_FOLDER, Spool

    spool = Spool(run_artifact_dir(run_id) / SPOOL_FOLDER, 1, make_spool_key(run_id, 1))
    seq = 0

    def add(build) -> None:
        nonlocal seq
        seq += 1
        spool.append(build(seq).payload())

    add(lambda s: Event(seq=s, kind="started", data={"iterations": iterations}))
    add(lambda s: Event(seq=s, kind="placed", data={"processes": []}))
    for step in range(1, iterations + 1):
        add(lambda s, i=step: Metrics(seq=s, step=i, time=1e9 + i,
                                      values=iteration_values(i, values)))  # fmt: skip
        add(lambda s, i=step: Progress(seq=s, step=i, total=iterations))
        if step % 10 == 0:
            add(lambda s, i=step: Event(seq=s, kind="checkpoint", data={"iteration": i}))
    add(lambda s: Event(seq=s, kind="finished", data={"summary": {"loss": 0.1}}))
    spool.close()
    return spool.path, seq


def one_at_a_time(run) -> int:
    """The baseline: every line verified, parsed and stored on its own."""
    from controlplane.runs import telemetry
    from controlplane.runs.artifacts import run_artifact_dir
    from controlplane.runs.tokens import make_spool_key
    from trainer.link.spool import SPOOL_FOLDER, is_authentic, split_line

    key = make_spool_key(run.pk, 1).encode()
    path = run_artifact_dir(run.pk) / SPOOL_FOLDER / "attempt-1.jsonl"
    stored = 0
    with path.open("rb") as lines:
        for line in lines:
            mac, payload = split_line(line.rstrip(b"\n"))
            assert is_authentic(key, mac, payload)
            message = telemetry.parse_message(payload.decode())
            stored += telemetry.record(run.pk, message, 1, moves_state=True)
    path.unlink()
    return stored


def timed_rate(experiment, iterations: int, values: int, ingest) -> tuple[float, int, int]:
    """(new messages per second, messages, spool bytes) of one ingest of a fresh run."""
    from controlplane.runs.models import Run

    run = Run.objects.create(
        experiment=experiment, revision=experiment.latest_revision, config_yaml="{}\n"
    )
    path, messages = write_spool(run.pk, iterations, values)
    size = path.stat().st_size
    started = time.perf_counter()
    stored = ingest(run)
    elapsed = time.perf_counter() - started
    assert stored == messages, (stored, messages)
    return messages / elapsed, messages, size


def copy_floor(experiment, iterations: int, values: int) -> float:
    """Seconds of a bare COPY of the spool's points in one transaction (what storing
    them cannot go below), for context."""
    from django.db import transaction

    from controlplane.runs.metric_points import copy_points, point_rows
    from controlplane.runs.models import Run

    run = Run.objects.create(
        experiment=experiment, revision=experiment.latest_revision, config_yaml="{}\n"
    )
    known: dict[str, int] = {}
    rows = [row for step in range(1, iterations + 1)
            for row in point_rows(run.pk, step, 1e9 + step, iteration_values(step, values),
                                  known)]  # fmt: skip
    started = time.perf_counter()
    with transaction.atomic():
        copy_points(rows)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=5000)
    parser.add_argument("--values", type=int, default=40, help="values per metrics message")
    args = parser.parse_args()
    var_dir = Path(tempfile.mkdtemp(prefix="bench-spool-"))
    set_up(var_dir)

    from controlplane.experiments.services import create_experiment
    from controlplane.runs.models import MetricPoint, Run
    from controlplane.runs.spool_ingest import PASS_BUDGET_S, ingest_spools
    from controlplane.runs.tasks import LIMITS

    experiment = create_experiment(f"bench-spool-{os.getpid()}", "algorithm: {name: ppo}\n")
    try:
        ours, baseline = [], []
        for repeat in range(args.repeats):
            rate, messages, size = timed_rate(
                experiment, args.iterations, args.values, lambda run: ingest_spools(run).stored
            )
            ours.append(rate)
            base, _, _ = timed_rate(experiment, args.iterations, args.values, one_at_a_time)
            baseline.append(base)
            floor = messages / copy_floor(experiment, args.iterations, args.values)
            print(f"repeat {repeat + 1}: ours {rate:,.0f}, one at a time {base:,.0f}, "
                  f"bare COPY of the points {floor:,.0f} messages/s "
                  f"({messages:,} messages, {size / 2**20:.1f} MiB)")  # fmt: skip
    finally:
        MetricPoint.objects.filter(key__run__experiment=experiment).delete()
        Run.objects.filter(experiment=experiment).delete()  # their other rows with them
        experiment.delete()
        shutil.rmtree(var_dir, ignore_errors=True)

    ours_rate, base_rate = statistics.median(ours), statistics.median(baseline)
    bytes_per_message = size / messages
    spool_s = SPOOL_MIB * 2**20 / bytes_per_message / ours_rate
    print(
        f"a {SPOOL_MIB} MiB spool of such messages ({bytes_per_message:.0f} bytes each): "
        f"{spool_s:.0f} s at our median rate, in passes of {PASS_BUDGET_S:.0f} s "
        f"(the reconcile task's soft limit: {LIMITS['soft_time_limit']} s); "
        f"one at a time: {SPOOL_MIB * 2**20 / bytes_per_message / base_rate:.0f} s"
    )
    print(
        f"RESULT bench=spool_ingest ours={ours_rate:.0f} baseline={base_rate:.0f} "
        f"ratio={ours_rate / base_rate:.2f} unit=messages/s better=higher"
    )


if __name__ == "__main__":
    main()
