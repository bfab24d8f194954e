"""Taking in a run's link spool: only lines signed with the attempt's own spool key are
stored; any other line (another run's, unsigned, or no message at all) is refused,
counted on the run and reported in one event per pass, and never stops the pass. A pass
resumes where the last one stopped, and only one pass works on a run at a time."""

import json
import os
import sys
import threading
import time

import pytest
from django.db import connection, transaction

from controlplane.runs import ray_jobs, reconcile, submission
from controlplane.runs.artifacts import run_artifact_dir
from controlplane.runs.models import MetricPoint, Run, RunEvent, RunState, TelemetryBatch
from controlplane.runs.spool_ingest import (
    BATCH_MESSAGES,
    PASS_BUDGET_S,
    _one_pass_at_a_time,
    has_spool,
    ingest_spools,
)
from controlplane.runs.tasks import LIMITS
from controlplane.runs.telemetry import Refusal, link_refusal
from controlplane.runs.tokens import make_run_token, make_spool_key
from tests.processes import free_port, wait_until
from tests.runs import submitted_run
from trainer.link.environment import link_from_env
from trainer.link.protocol import Event, Metrics
from trainer.link.spool import SPOOL_FOLDER, line_mac, spool_line

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(300),
    pytest.mark.embedded,
]


@pytest.fixture(autouse=True)
def own_artifacts(settings, tmp_path):
    settings.ARTIFACTS_DIR = tmp_path / "artifacts"


@pytest.fixture
def run() -> Run:
    return submitted_run("spool")


def spool_file(run: Run, attempt: int = 1):
    return run_artifact_dir(run.pk) / SPOOL_FOLDER / f"attempt-{attempt}.jsonl"


def honest_trainer(run: Run, iterations: int = 3, keys: int = 3) -> None:
    """What a trainer launched for the run's attempt leaves when the control plane is
    away: its link, from the job's own environment, spools every message."""
    environ = {**submission.job_environment(run),
               "ARMATURE_URL": f"http://127.0.0.1:{free_port()}"}  # fmt: skip
    link = link_from_env(environ, run_folder=run_artifact_dir(run.pk))
    link.event("started", {"iterations": iterations})
    for step in range(1, iterations + 1):
        link.metrics(step, {f"loss/{k}": step / (k + 1) for k in range(keys)})
    link.event("finished", {"summary": {"loss/0": float(iterations)}})
    assert link.close(timeout=0.1) is False  # nobody acknowledged: all left in the spool


def signed_lines(run_id: int, attempt: int, payloads: list[str | bytes]) -> bytes:
    """Lines as a trainer holding the attempt's key writes them, for any payload."""
    key = make_spool_key(run_id, attempt).encode()
    lines = []
    for payload in payloads:
        if isinstance(payload, str):
            lines.append(spool_line(key, payload))
        else:  # bytes that are not UTF-8 text
            lines.append(line_mac(key, payload) + b" " + payload + b"\n")
    return b"".join(lines)


def refused_events(run: Run) -> list[RunEvent]:
    return list(RunEvent.objects.filter(run=run, kind="spool_refused"))


def test_an_honest_trainers_spool_is_taken_in_and_decides_the_runs_end(run):
    honest_trainer(run)
    assert has_spool(run.pk)
    report = ingest_spools(run)
    assert report.done and report.stored == 1 + 3 + 1 and not report.refused
    run.refresh_from_db()
    assert run.state == RunState.SUCCEEDED and run.exit_reason == "the trainer finished"
    assert run.summary == {"loss/0": 3.0} and run.link_rejected == 0
    assert MetricPoint.objects.filter(key__run=run).count() == 3 * 3
    assert refused_events(run) == []
    assert not spool_file(run).exists() and not has_spool(run.pk)


def test_a_spool_written_with_another_runs_key_is_refused_and_counted(run):
    other = submitted_run(run.experiment)
    honest_trainer(other)  # a job on the shared storage, with its own key…
    spool_file(run).parent.mkdir(parents=True)
    spool_file(other).rename(spool_file(run))  # …drops its spool into this run's folder
    report = ingest_spools(run)
    assert report.stored == 0 and report.refused == {"foreign": 5}
    run.refresh_from_db()
    assert run.state == RunState.SUBMITTING  # its `finished` moved nothing
    assert run.link_rejected == 5 and not TelemetryBatch.objects.filter(run=run).exists()
    (event,) = refused_events(run)
    assert event.data["refused"] == {"foreign": 5}
    assert "5 lines refused (5 not signed with this attempt's spool key)" in event.message
    assert not spool_file(run).exists()


def test_a_spool_that_is_a_link_or_a_fifo_is_never_read(run):
    other = submitted_run(run.experiment)
    honest_trainer(other)
    spool_file(run).parent.mkdir(parents=True)
    spool_file(run).symlink_to(spool_file(other))  # signed, but for another run
    os.mkfifo(spool_file(run, attempt=2))  # a reader would wait on it for ever
    report = ingest_spools(run)
    assert report.done and report.stored == 0 and not report.refused
    assert not has_spool(run.pk) and not spool_file(run).is_symlink()
    assert spool_file(other).exists()  # what the link pointed at is left alone
    # A linked spool folder is not there at all.
    spool_file(run).parent.rmdir()
    spool_file(run).parent.symlink_to(spool_file(other).parent, target_is_directory=True)
    assert not has_spool(run.pk) and ingest_spools(run).stored == 0
    assert not TelemetryBatch.objects.filter(run=run).exists()


def test_unsigned_lines_and_another_attempts_lines_are_refused(run):
    payload = Metrics(seq=1, step=1, time=1.0, values={"loss": 1.0}).payload()
    spool_file(run).parent.mkdir(parents=True)
    spool_file(run).write_bytes(
        payload.encode() + b"\n"  # the format before lines were signed
        + signed_lines(run.pk, 2, [payload])  # the run's next attempt's key, not this one's
        + signed_lines(run.pk, 1, [Metrics(seq=2, step=2, time=2.0, values={"loss": 2.0})
                                   .payload()])
    )  # fmt: skip
    report = ingest_spools(run)
    assert report.stored == 1 and report.refused == {"unsigned": 1, "foreign": 1}
    assert list(TelemetryBatch.objects.filter(run=run).values_list("seq", flat=True)) == [2]
    assert Run.objects.get(pk=run.pk).link_rejected == 2


def test_lines_that_are_no_message_are_skipped_counted_and_reported_once(run):
    good = [Metrics(seq=seq, step=seq, time=1.0, values={"loss": 0.1}).payload()
            for seq in range(1, 4)]  # fmt: skip
    finished = Event(seq=9, kind="finished", data={"summary": {"loss": 0.1}}).payload()
    spool_file(run).parent.mkdir(parents=True)
    spool_file(run).write_bytes(
        signed_lines(run.pk, 1, [
            good[0], '{"seq":"1"}', '{"seq": 1.5}', "[1, 2]", good[1],
            "[" * 100_000 + "]" * 100_000, b'{"seq": 4, "x": "\xff"}',
            json.dumps({"seq": 5, "type": "metrics", "values": {"x": "y" * 10 * 2**20}}),
            good[2], finished,
        ])
        + b"0" * 64 + b' {"seq": 10, "type": "ev'  # cut short: no newline
    )  # fmt: skip
    report = ingest_spools(run)
    assert report.done and report.stored == 4
    assert report.refused == {"invalid": 4, "not_utf8": 1, "too_long": 1, "cut_short": 1}
    run.refresh_from_db()
    assert run.state == RunState.SUCCEEDED and run.link_rejected == 7
    (event,) = refused_events(run)
    assert event.data["refused"] == dict(report.refused)
    assert event.message.startswith("link spool: 7 lines refused (4 not a valid message")
    assert "discriminator 'type'" in event.data["examples"]["invalid"]  # the first's error


def test_a_pass_out_of_time_notes_its_progress_and_the_next_goes_on_from_there(run):
    messages = 2 * BATCH_MESSAGES + 100
    spool_file(run).parent.mkdir(parents=True)
    spool_file(run).write_bytes(
        signed_lines(run.pk, 1, ["not json"] + [
            Metrics(seq=seq, step=seq, time=1.0, values={"loss": seq}).payload()
            for seq in range(1, messages + 1)
        ])
    )  # fmt: skip
    mark = spool_file(run).with_suffix(".ingested")
    first = ingest_spools(run, budget_s=0)  # out of time after its first batch
    assert not first.done and first.stored == BATCH_MESSAGES
    assert 0 < int(mark.read_text()) < spool_file(run).stat().st_size
    second = ingest_spools(run, budget_s=0)
    assert not second.done and second.stored == BATCH_MESSAGES
    third = ingest_spools(run)
    assert third.done and third.stored == 100
    assert TelemetryBatch.objects.filter(run=run).count() == messages  # none twice
    assert MetricPoint.objects.filter(key__run=run).count() == messages
    assert Run.objects.get(pk=run.pk).link_rejected == 1  # counted once, not per pass
    assert not mark.exists() and not spool_file(run).exists()


def test_the_pass_budget_lies_within_the_reconcile_tasks_time_limit():
    assert PASS_BUDGET_S < LIMITS["soft_time_limit"] - 10


def test_a_second_pass_while_one_works_on_the_run_skips_it(run):
    honest_trainer(run, iterations=600)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with _one_pass_at_a_time(run.pk) as mine:
                assert mine
                held.set()
                release.wait(30)
        finally:
            connection.close()  # this thread's own

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(30)
        report = ingest_spools(run)
        assert report.skipped and not report.done and report.stored == 0
        assert spool_file(run).exists() and not TelemetryBatch.objects.filter(run=run).exists()
    finally:
        release.set()
        holder.join()
    assert ingest_spools(run).stored == 602


def test_two_concurrent_passes_store_each_message_once_and_one_skips(run):
    honest_trainer(run, iterations=600)
    reports = {}

    def ingest(name: str) -> None:
        try:
            reports[name] = ingest_spools(Run.objects.get(pk=run.pk))
        finally:
            connection.close()  # this thread's own

    first, second = (threading.Thread(target=ingest, args=(n,)) for n in ("first", "second"))
    # The first pass is kept inside its work: its first write waits on a row this test
    # holds uncommitted, so the second pass surely comes while the first holds the run.
    with transaction.atomic():
        TelemetryBatch.objects.create(run=run, attempt=1, seq=1, kind="event")
        first.start()
        time.sleep(1.0)
        second.start()
        second.join(30)
        transaction.set_rollback(True)
    first.join(60)
    assert reports["second"].skipped and reports["first"].done
    assert reports["first"].stored == 602
    seqs = list(TelemetryBatch.objects.filter(run=run).values_list("seq", flat=True))
    assert sorted(seqs) == list(range(1, 603))


FAKE_TRAINER = """
import os, sys
from pathlib import Path

from trainer.link.environment import link_from_env
from trainer.link.spool import spool_line

folder = Path(sys.argv[sys.argv.index("--output-dir") + 1])
spool = folder / "link-spool" / f"attempt-{os.environ['ARMATURE_RUN_ATTEMPT']}.jsonl"
spool.parent.mkdir(parents=True)
key = os.environ["ARMATURE_SPOOL_KEY"].encode()
with spool.open("ab") as lines:  # bad lines first, signed with the attempt's own key
    for bad in ['{"seq":"1"}', '{"seq": 1.5}', "[" * 100000 + "]" * 100000,
                '{"seq": 3, "x": "' + "y" * 10 * 2**20 + '"}']:
        lines.write(spool_line(key, bad))
    lines.write(b"\\xff\\xfe no MAC, not UTF-8\\n")
link = link_from_env(run_folder=folder)  # continues the spool past them
link.event("started", {})
link.metrics(1, {"loss": 0.5})
link.event("finished", {"summary": {"loss": 0.5}})
sys.exit(0 if link.close(timeout=0.5) is False else 3)
"""


@pytest.fixture
def ray_trainer(ray_head, settings, tmp_path):
    """Jobs on a real Ray head whose `python -m trainer run` is FAKE_TRAINER: a trainer
    that left bad lines in its spool and could not reach the control plane."""
    settings.RAY_ADDRESS = ray_head.url
    settings.ARMATURE_WEB_URL = f"http://127.0.0.1:{free_port()}"  # nobody listening
    (tmp_path / "fake_trainer.py").write_text(FAKE_TRAINER)
    python = tmp_path / "trainer-python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} {tmp_path / "fake_trainer.py"} "$@"\n')
    python.chmod(0o755)
    settings.ARMATURE_TRAINER_PYTHON = str(python)


def test_a_run_whose_spool_holds_bad_lines_still_ends_through_reconciliation(ray_trainer, run):
    submission.submit(run.pk)
    submission_id = Run.objects.get(pk=run.pk).submission_id
    wait_until(lambda: ray_jobs.state(submission_id).ended, 120, "the job to end", 0.5)
    log = ray_jobs.log_tail(submission_id, 50, 64 * 1024)
    assert ray_jobs.state(submission_id).status == "SUCCEEDED", log

    reconcile.reconcile(run.pk)
    run.refresh_from_db()
    assert run.state == RunState.SUCCEEDED and run.exit_reason == "the trainer finished"
    assert run.summary == {"loss": 0.5} and run.job_ended
    assert link_refusal(run.pk, make_run_token(run.pk, run.attempt)) == Refusal.RUN_FINISHED
    assert run.link_rejected == 5
    (event,) = refused_events(run)
    assert event.data["refused"] == {"invalid": 3, "too_long": 1, "unsigned": 1}
    assert not has_spool(run.pk)
    assert reconcile.runs_to_reconcile() == []
