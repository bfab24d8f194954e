"""The trainer link under faults, with real processes: a trainer process reporting to a
live daphne (started as `./armature up` starts it) through a gate the test can close.
Every point is stored exactly once whatever happens on the way."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.db.models import Count

from controlplane.runs.artifacts import run_artifact_dir
from controlplane.runs.models import MetricPoint, Run, RunState, TelemetryBatch
from controlplane.runs.spool_ingest import ingest_spools
from controlplane.runs.tokens import make_run_token, make_spool_key
from tests.processes import free_port, wait_until
from tests.runs import submitted_run
from tests.tcp_gate import TcpGate
from trainer.link.client import TrainerLink

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

SMALL = [
    "env.num_parallel_envs=4", "algorithm.data_batch_size=8", "runner.progress=false",
    "algorithm.update_epochs=1", "algorithm.num_minibatches=2", "runner.torch_threads=1",
]  # fmt: skip


@pytest.fixture
def run() -> Run:
    return submitted_run("link-faults")


def start_trainer(url: str, run: Run, folder: Path, *overrides: str, attempt: int = 1,
                  resume: bool = False) -> subprocess.Popen:  # fmt: skip
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith("DJANGO")},
        "ARMATURE_URL": url,
        "ARMATURE_RUN_ID": str(run.pk),
        "ARMATURE_RUN_TOKEN": make_run_token(run.pk, attempt),
        "ARMATURE_RUN_ATTEMPT": str(attempt),
        "ARMATURE_SPOOL_KEY": make_spool_key(run.pk, attempt),
        "ARMATURE_LINK_FLUSH_S": "30",
    }
    command = [
        sys.executable, "-m", "trainer", "run", "examples/builtin_ppo.yaml", *SMALL,
        *overrides, "--output-dir", str(folder), *(["--resume-if-any"] if resume else []),
    ]  # fmt: skip
    return subprocess.Popen(
        command, cwd=settings.BASE_DIR, env=environment, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def iterations_written(folder: Path) -> int:
    path = folder / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def stored_steps(run: Run) -> list[int]:
    points = MetricPoint.objects.filter(key__run=run, key__name="rollout/success_rate").order_by(
        "step"
    )
    return list(points.values_list("step", flat=True))


def assert_exactly_once(run: Run, folder: Path) -> None:
    """Every iteration the trainer wrote to disk is stored once, every key of it."""
    written = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert stored_steps(run) == [line["iteration"] for line in written]
    repeated = (
        MetricPoint.objects.filter(key__run=run).values("key", "step").annotate(n=Count("pk"))
    )
    assert not repeated.filter(n__gt=1).exists()
    for attempt in {b.attempt for b in TelemetryBatch.objects.filter(run=run)}:
        seqs = sorted(
            TelemetryBatch.objects.filter(run=run, attempt=attempt).values_list("seq", flat=True)
        )
        assert seqs == list(range(1, len(seqs) + 1)), f"attempt {attempt} has gaps"


def stop_trainer(trainer: subprocess.Popen) -> str:
    trainer.send_signal(signal.SIGTERM)  # what Ray sends when the job is stopped
    output, _ = trainer.communicate(timeout=120)
    assert trainer.returncode == 130, output
    return output


def test_a_web_server_restart_mid_run_stores_every_point_exactly_once(web, run, tmp_path):
    trainer = start_trainer(web.url, run, tmp_path, "runner.iterations=100000")
    try:
        wait_until(lambda: len(stored_steps(run)) >= 2, 120, "the first points")
        web.close()  # the control plane goes away mid-run…
        down_at = iterations_written(tmp_path)
        wait_until(lambda: iterations_written(tmp_path) >= down_at + 3, 120, "training on")
        web.start_web()  # …and comes back on the same address
        written = iterations_written(tmp_path)
        wait_until(lambda: len(stored_steps(run)) > written, 120, "the link to catch up")
    finally:
        output = stop_trainer(trainer)
    assert "unacknowledged" not in output
    assert_exactly_once(run, tmp_path)
    assert Run.objects.get(pk=run.pk).events.filter(kind="stopped").exists()


def test_a_cut_link_spools_to_disk_and_delivers_after_reconnect(web, run, tmp_path):
    gate = TcpGate(web.port)
    trainer = start_trainer(gate.url, run, tmp_path, "runner.iterations=100000")
    spool = tmp_path / "link-spool" / "attempt-1.jsonl"
    try:
        wait_until(lambda: len(stored_steps(run)) >= 2, 120, "the first points")
        gate.close()
        cut_at = len(stored_steps(run))
        # Training goes on while the link is down, through the link's reconnect attempts…
        wait_until(lambda: iterations_written(tmp_path) > cut_at + 10, 120, "training on")
        written = iterations_written(tmp_path)
        acked = int((tmp_path / "link-spool" / "attempt-1.acked").read_text())
        spooled = [json.loads(line.split(" ", 1)[1]) for line in spool.read_text().splitlines()]
        unacked = [m for m in spooled if m["seq"] > acked]
        assert len(unacked) >= 2 * (written - cut_at) - 2  # …and kept every message on disk
        gate.open()
        wait_until(lambda: len(stored_steps(run)) >= written, 120, "the spool to arrive")
    finally:
        stop_trainer(trainer)
        gate.close()
    assert_exactly_once(run, tmp_path)
    assert not spool.exists()  # everything acknowledged: the trainer removed it


def test_a_resubmitted_runs_second_attempt_is_stored(web, run, tmp_path):
    first = start_trainer(web.url, run, tmp_path, "runner.iterations=100000")
    wait_until(lambda: len(stored_steps(run)) >= 2, 120, "the first attempt's points")
    first.kill()  # the job dies (OOM, a lost node); Ray's job is gone with it
    first.communicate(timeout=30)
    Run.objects.filter(pk=run.pk).update(attempt=2)  # what resubmitting a reported run does
    # The first attempt may have run well past its second point before the kill landed.
    last = iterations_written(tmp_path) + 3
    second = start_trainer(
        web.url, run, tmp_path, f"runner.iterations={last}", "runner.checkpoint_every=1",
        attempt=2, resume=True,
    )  # fmt: skip
    output, _ = second.communicate(timeout=180)
    assert second.returncode == 0, output
    run.refresh_from_db()
    assert run.state == RunState.SUCCEEDED and run.summary["rollout/success_rate"] >= 0
    assert {b.attempt for b in TelemetryBatch.objects.filter(run=run)} == {1, 2}
    assert stored_steps(run)[-1] == last
    assert TelemetryBatch.objects.filter(run=run, attempt=2, seq=1).exists()


def test_a_burst_beyond_the_channel_layers_capacity_is_stored_completely(web, run):
    link = TrainerLink(web.url, run.pk, make_run_token(run.pk))
    for step in range(1, 2001):  # the in-memory layer holds 100 per channel
        link.metrics(step, {"rollout/success_rate": step / 2000, "losses/value_loss": 0.1})
    assert link.close(timeout=120) is True
    assert stored_steps(run) == list(range(1, 2001))
    assert TelemetryBatch.objects.filter(run=run).count() == 2000


def test_what_a_trainer_could_not_deliver_is_ingested_from_its_spool(run):
    tmp_path = run_artifact_dir(run.pk)  # where the control plane looks for it
    unreachable = f"http://127.0.0.1:{free_port()}"
    trainer = start_trainer(unreachable, run, tmp_path, "runner.iterations=3")
    output, _ = trainer.communicate(timeout=180)
    assert trainer.returncode == 0, output
    assert "stay in" in output  # the link said where it left them
    assert stored_steps(run) == []
    # started, placed, model, 3 × (metrics, progress), checkpoint, finished, and the
    # example's two episode videos of iteration 1
    assert ingest_spools(run).stored == 3 + 3 * 2 + 1 + 1 + 2
    run.refresh_from_db()
    assert run.state == RunState.SUCCEEDED and run.exit_reason == "the trainer finished"
    assert 0 <= run.summary["rollout/success_rate"] <= 1 and run.progress_step == 3
    assert_exactly_once(run, tmp_path)
    assert not (tmp_path / "link-spool" / "attempt-1.jsonl").exists()
    assert ingest_spools(run).stored == 0
