"""Launching runs as Ray jobs, keeping their state true to Ray's, stopping them.

Celery tasks call these; each is safe to run twice (a retried or re-delivered task):
the Ray job's submission id is fixed per run, and state changes go through
`runs.state.transition`.
"""

import shlex
import sys
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane.experiments.models import Experiment, Revision
from controlplane.inventory.models import Cluster
from controlplane.inventory.services import cluster_section
from controlplane.runs import ray_jobs
from controlplane.runs.models import Run, RunEvent, RunState
from controlplane.runs.state import IllegalTransition, transition
from controlplane.runs.tokens import make_run_token
from trainer.config.loading import apply_override, dump_config, parse_yaml, validate_config

# A run still queued, or "submitting" without a Ray job, this long after it was
# created or submitted is submitted again (the first attempt was lost, e.g. the
# worker died).
RESUBMIT_AFTER = timedelta(seconds=30)
LOG_TAIL_LINES = 20
TRAINER_DIR = Path(__file__).resolve().parents[2] / "trainer"


def freeze_config(revision: Revision, overrides: list[str], cluster: Cluster | None) -> str:
    """The config the trainer will run: the revision, the overrides, the cluster section;
    validated and written out with every default. Raises ConfigError."""
    data = parse_yaml(revision.config_yaml) or {}
    for override in overrides:
        apply_override(data, override)
    if cluster is not None:
        data["cluster"] = cluster_section(cluster)
    return dump_config(validate_config(data))


def launch_run(
    experiment: Experiment,
    *,
    user,
    revision: Revision | None = None,
    cluster: Cluster | None = None,
    overrides: list[str] | None = None,
    idempotency_key: str | None = None,
    timeout_s: int | None = None,
) -> tuple[Run, bool]:
    """Create a queued run and hand it to a worker for submission.

    Returns (run, created); with an idempotency key already used by this user, the
    existing run comes back and nothing new starts."""
    if idempotency_key:
        existing = Run.objects.filter(created_by=user, idempotency_key=idempotency_key).first()
        if existing is not None:
            return existing, False
    revision = revision or experiment.latest_revision
    overrides = list(overrides or [])
    config_yaml = freeze_config(revision, overrides, cluster)
    try:
        with transaction.atomic():
            run = Run.objects.create(
                experiment=experiment, revision=revision, cluster=cluster, overrides=overrides,
                config_yaml=config_yaml, created_by=user, idempotency_key=idempotency_key,
                timeout_s=timeout_s,
                progress_total=validate_config(parse_yaml(config_yaml)).runner.iterations,
            )  # fmt: skip
            RunEvent.objects.create(run=run, kind="launched", message=f"by {user}")
            transaction.on_commit(lambda: _enqueue_submit(run.pk))
    except IntegrityError:  # the same key raced in from a second request
        return Run.objects.get(created_by=user, idempotency_key=idempotency_key), False
    return run, True


def _enqueue_submit(run_id: int) -> None:
    from controlplane.runs.tasks import submit_run

    submit_run.delay(run_id)


def submit(run_id: int) -> Run:
    """Submit the run's Ray job (once, whatever the number of calls)."""
    run = Run.objects.get(pk=run_id)
    if run.is_final:
        return run
    if run.state == RunState.QUEUED:
        run = transition(run.pk, RunState.SUBMITTING)
    started = ray_jobs.submit(
        run.submission_id,
        entrypoint=entrypoint(),
        runtime_env=runtime_env(run),
        metadata={"armature_run": str(run.pk), "experiment": run.experiment.name},
    )
    Run.objects.filter(pk=run.pk).update(ray_job_id=run.submission_id)
    RunEvent.objects.create(
        run=run, kind="submitted" if started else "adopted", data={"job": run.submission_id}
    )
    return reconcile(run.pk)


def entrypoint() -> str:
    python = settings.ARMATURE_TRAINER_PYTHON or sys.executable
    return f"{shlex.quote(python)} -m trainer run config.yaml"


def runtime_env(run: Run) -> dict:
    """The job's files and environment: its frozen config, the trainer code, and what
    the trainer needs to report back (the control plane's URL and the run's token)."""
    job_dir = settings.VAR_DIR / "jobs" / str(run.pk)
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / "config.yaml").write_text(run.config_yaml)
    return {
        "working_dir": str(job_dir),
        "py_modules": [str(TRAINER_DIR)],
        "env_vars": {
            "ARMATURE_URL": settings.ARMATURE_WEB_URL,
            "ARMATURE_RUN_ID": str(run.pk),
            "ARMATURE_RUN_TOKEN": make_run_token(run.pk),
        },
    }


def reconcile(run_id: int) -> Run:
    """Bring the run's state in line with its Ray job's."""
    run = Run.objects.get(pk=run_id)
    if run.is_final:
        return run
    if run.state == RunState.QUEUED:
        # Its submit task was lost (e.g. the worker died holding it): submit again.
        if timezone.now() - run.created_at > RESUBMIT_AFTER:
            return submit(run.pk)
        return run
    job = ray_jobs.state(run.submission_id)
    if job.status == "MISSING":
        if run.submitted_at and timezone.now() - run.submitted_at > RESUBMIT_AFTER:
            return submit(run.pk)
        return run
    if run.timeout_s and run.started_at:
        if timezone.now() - run.started_at > timedelta(seconds=run.timeout_s):
            ray_jobs.stop(run.submission_id)
            return _finish(run, RunState.TIMED_OUT, f"no result after {run.timeout_s} s")
    if job.status == "RUNNING" and run.state == RunState.SUBMITTING:
        return transition(run.pk, RunState.RUNNING, ray_job_id=run.submission_id)
    if job.status == "SUCCEEDED":
        return _finish(run, RunState.SUCCEEDED, job.message)
    if job.status == "FAILED":
        return _finish(run, RunState.FAILED, _failure_reason(run, job.message))
    if job.status == "STOPPED":
        return _finish(run, RunState.CANCELLED, job.message or "stopped")
    return run


def _failure_reason(run: Run, message: str) -> str:
    tail = ray_jobs.logs(run.submission_id).strip().splitlines()[-LOG_TAIL_LINES:]
    return "\n".join([message, *tail]).strip()


def _finish(run: Run, state: RunState, reason: str) -> Run:
    try:
        return transition(run.pk, state, reason)
    except IllegalTransition:  # another path finished it first (e.g. a cancel)
        return Run.objects.get(pk=run.pk)


def active_run_ids() -> list[int]:
    return list(
        Run.objects.filter(
            state__in=[RunState.QUEUED, RunState.SUBMITTING, RunState.RUNNING]
        ).values_list("pk", flat=True)
    )


def cancel(run_id: int, reason: str = "cancelled") -> Run:
    run = Run.objects.get(pk=run_id)
    if run.is_final:
        return run
    if run.state != RunState.QUEUED:
        ray_jobs.stop(run.submission_id)
    return _finish(run, RunState.CANCELLED, reason)


def job_logs(run: Run) -> str:
    return ray_jobs.logs(run.submission_id) if run.ray_job_id else ""
