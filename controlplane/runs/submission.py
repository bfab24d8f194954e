"""Submitting a run's Ray job, once per attempt whatever the number of calls.

The row lock orders a submission against a cancel: the run is marked as having a job
(`job_ended=False`) before Ray is asked, and re-read after; a cancel that arrived in
between stops the job that was just created, so no job runs for a cancelled run.
"""

import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings
from django.db import transaction

from controlplane.runs import ray_jobs
from controlplane.runs.artifacts import (
    RunFolderTaken,
    allowed_roots,
    make_run_folder,
    run_artifact_dir,
)
from controlplane.runs.evaluations import eval_arguments
from controlplane.runs.models import Run, RunEvent, RunState, TelemetryBatch
from controlplane.runs.state import transition
from controlplane.runs.tokens import make_run_token, make_spool_key
from trainer.config.path_roots import ROOTS_ENV

TRAINER_DIR = Path(__file__).resolve().parents[2] / "trainer"
STOP_GRACE_S = 20


def submit(run_id: int) -> Run:
    """Submit the run's current attempt as a Ray job (adopting it if it exists)."""
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        if not run.is_active or run.cancel_requested_at is not None:
            return run
        if run.state == RunState.QUEUED:
            if run.attempt == 1:  # its first submission: its folder is made now, fresh
                try:
                    make_run_folder(run.pk)
                except RunFolderTaken as taken:
                    return transition(run.pk, RunState.FAILED, str(taken))
            run = transition(run.pk, RunState.SUBMITTING)
        Run.objects.filter(pk=run.pk).update(job_ended=False)
    with job_folder(run) as working_dir:
        started = ray_jobs.submit(
            run.submission_id,
            entrypoint=entrypoint(run),
            runtime_env=runtime_env(run, working_dir),
            metadata={"armature_run": str(run.pk), "attempt": str(run.attempt),
                      "experiment": run.experiment.name},
        )  # fmt: skip
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        Run.objects.filter(pk=run.pk).update(ray_job_id=run.submission_id, job_ended=False)
        RunEvent.objects.create(
            run=run, kind="submitted" if started else "adopted",
            data={"job": run.submission_id, "attempt": run.attempt},
        )  # fmt: skip
        cancelled_meanwhile = not run.is_active or run.cancel_requested_at is not None
    if cancelled_meanwhile:
        ray_jobs.stop(run.submission_id)
    return Run.objects.get(pk=run_id)


def submit_again(run_id: int) -> Run:
    """Submit a run whose job Ray lost. If that attempt already reported, the new job is
    a new attempt (fresh sequence numbers and token); else the same one, so a first
    submission that shows up late is adopted, not doubled."""
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        if TelemetryBatch.objects.filter(run=run, attempt=run.attempt).exists():
            Run.objects.filter(pk=run.pk).update(attempt=run.attempt + 1)
    return submit(run_id)


def entrypoint(run: Run) -> str:
    python = settings.ARMATURE_TRAINER_PYTHON or sys.executable
    if run.is_eval:  # evaluates its source run's checkpoint; every attempt starts afresh
        return shlex.join([python, "-m", "trainer", *eval_arguments(run)])
    command = [python, "-m", "trainer", "run", "config.yaml",
               "--output-dir", str(run_artifact_dir(run.pk).resolve())]  # fmt: skip
    # A later attempt continues from the run's last checkpoint; an attempt submitted
    # again (Ray lost its job) continues in the folder it may have begun to write. Its
    # first job may be recorded as adopted: a submission whose reply was lost (a timeout
    # on a loaded head) created the job all the same, and its retry found it.
    earlier_job = RunEvent.objects.filter(run=run, kind__in=("submitted", "adopted"))
    if run.attempt > 1 or earlier_job.exists():
        command.append("--resume-if-any")
    return shlex.join(command)


@contextmanager
def job_folder(run: Run) -> Iterator[Path]:
    """A new folder holding the run's frozen config, for Ray to upload as the job's
    working directory; removed once submitted (Ray keeps its own copy). New at every
    submission, under a name no one can guess in advance, so nothing planted beforehand
    (a file, a link, a module the job would import first) is ever uploaded with it."""
    root = settings.VAR_DIR / "jobs"
    root.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f"run-{run.pk}-", dir=root))
    try:
        (folder / "config.yaml").write_text(run.config_yaml)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def runtime_env(run: Run, working_dir: Path) -> dict:
    """The job's files and environment: its frozen config (in `working_dir`), the
    trainer code, and `job_environment`."""
    return {
        "working_dir": str(working_dir),
        "py_modules": [str(TRAINER_DIR)],
        "env_vars": job_environment(run),
    }


def job_environment(run: Run) -> dict[str, str]:
    """What the trainer needs to report back (the control plane's URL, the attempt's
    token and spool key) and the folders its config's files may lie in."""
    return {
        "ARMATURE_URL": settings.ARMATURE_WEB_URL,
        "ARMATURE_RUN_ID": str(run.pk),
        "ARMATURE_RUN_TOKEN": make_run_token(run.pk, run.attempt),
        "ARMATURE_RUN_ATTEMPT": str(run.attempt),
        "ARMATURE_SPOOL_KEY": make_spool_key(run.pk, run.attempt),
        # The only folders the files its config names may lie in.
        ROOTS_ENV: os.pathsep.join(str(root.resolve()) for root in allowed_roots()),
        # Between Ray's SIGTERM and its SIGKILL when the job is stopped: time for the
        # trainer to finish its iteration and save a checkpoint to resume from.
        "RAY_JOB_STOP_WAIT_TIME_S": str(STOP_GRACE_S),
    }
