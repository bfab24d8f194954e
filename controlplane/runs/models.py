"""Runs: a frozen config launched as a Ray job, its state machine, events and metrics."""

import json

import yaml
from django.conf import settings
from django.db import models
from django.utils import timezone


class RunState(models.TextChoices):
    QUEUED = "queued"
    SUBMITTING = "submitting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    # The control plane that owned its Ray head was stopped under it; resumable.
    INTERRUPTED = "interrupted"


class RunKind(models.TextChoices):
    TRAIN = "train"
    # Evaluates a checkpoint of another run (its source) with `python -m trainer eval`.
    EVAL = "eval"


# The summary key of an eval run's suite average (trainer.link.reporter.eval_summary).
EVAL_SUCCESS_KEY = "eval/success_rate"

ACTIVE_STATES = frozenset({RunState.QUEUED, RunState.SUBMITTING, RunState.RUNNING})
FINAL_STATES = frozenset(
    {RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED, RunState.TIMED_OUT}
)


class Run(models.Model):
    experiment = models.ForeignKey(
        "experiments.Experiment", on_delete=models.PROTECT, related_name="runs"
    )
    revision = models.ForeignKey("experiments.Revision", on_delete=models.PROTECT)
    cluster = models.ForeignKey(
        "inventory.Cluster", null=True, blank=True, on_delete=models.SET_NULL
    )
    kind = models.CharField(max_length=10, choices=RunKind.choices, default=RunKind.TRAIN)
    # An eval run's source: the run whose checkpoint (of iteration `source_iteration`) it
    # evaluates, with `eval_options` {"suite", "tasks", "states"} (null: the defaults).
    source_run = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="evaluations"
    )
    source_iteration = models.PositiveIntegerField(null=True, blank=True)
    eval_options = models.JSONField(default=dict, blank=True)
    overrides = models.JSONField(default=list, blank=True, help_text='["key=value", …]')
    # Labels to find the run by: its experiment's tags at launch plus any given then.
    tags = models.JSONField(default=list, blank=True)
    # The config exactly as the trainer receives it (revision + overrides + cluster).
    config_yaml = models.TextField()
    # The same, parsed (filled on save): what the runs list's config columns show and
    # sort by in the database; {} when the text is not a mapping.
    config = models.JSONField(default=dict, blank=True, editable=False)
    state = models.CharField(max_length=20, choices=RunState.choices, default=RunState.QUEUED)
    exit_reason = models.TextField(blank=True)
    progress_step = models.PositiveIntegerField(default=0)
    progress_total = models.PositiveIntegerField(default=0)
    summary = models.JSONField(default=dict, blank=True)
    timeout_s = models.PositiveIntegerField(
        null=True, blank=True, help_text="Stop the run as timed out after this many seconds."
    )
    ray_job_id = models.CharField(max_length=200, blank=True)
    # Each Ray job started for the run is one attempt (a lost submission submitted
    # again, a resume): its own submission id, its own token, its own telemetry seqs.
    attempt = models.PositiveIntegerField(default=1)
    # False while a Ray job of the run may still be alive: reconciliation keeps
    # following (and, for a finished run, stopping) it until Ray says it ended.
    job_ended = models.BooleanField(default=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    # Link messages the protocol refused (malformed): each got an error frame.
    link_rejected = models.PositiveIntegerField(default=0)
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)
    submitted_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["created_by", "idempotency_key"], name="unique_idempotency_key"
            )
        ]
        indexes = [models.Index(fields=["state"])]

    def __str__(self) -> str:
        return f"run {self.pk} ({self.experiment.name})"

    def save(self, *args, **kwargs) -> None:
        if not self.config and self.config_yaml:
            self.config = parsed_config(self.config_yaml)
            if kwargs.get("update_fields") is not None:
                kwargs["update_fields"] = {*kwargs["update_fields"], "config"}
        super().save(*args, **kwargs)

    @property
    def is_final(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def is_active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def takes_reports(self) -> bool:
        """Whether its trainer may still report: while the run is active, and once it is
        cancelled until its job has ended (a stopped trainer's checkpoint and `stopped`
        report are on their way)."""
        return self.is_active or (self.state == RunState.CANCELLED and not self.job_ended)

    @property
    def is_eval(self) -> bool:
        return self.kind == RunKind.EVAL

    @property
    def success_rate(self) -> float | None:
        """The final overall success rate the trainer reported, if any (an eval run's:
        its suite average)."""
        return self.summary.get(EVAL_SUCCESS_KEY if self.is_eval else "rollout/success_rate")

    @property
    def shown_success(self) -> float | None:
        """A run's one success figure, on every page, in the API (`latest_success`) and
        in the CI client's summary: the last iteration's rollout success rate (its
        newest `rollout/success_rate` point, annotated by runs.selectors.with_figures),
        whether the run is going, finished or stopped; the final summary's where no
        point is stored; an eval run's suite average."""
        annotated = self.__dict__.get("latest_success")
        if annotated is not None and not self.is_eval:
            return annotated
        return self.success_rate

    @property
    def duration_text(self) -> str:
        """How long it ran (so far, while it runs), as the lists show it: "26 s",
        "4 min 5 s", "2 h 3 min"; "—" before it started."""
        if self.started_at is None:
            return "—"
        seconds = int(((self.finished_at or timezone.now()) - self.started_at).total_seconds())
        hours, rest = divmod(max(seconds, 0), 3600)
        minutes, seconds = divmod(rest, 60)
        if hours:
            return f"{hours} h {minutes} min"
        return f"{minutes} min {seconds} s" if minutes else f"{seconds} s"

    @property
    def submission_id(self) -> str:
        """The Ray job's submission id: fixed per attempt, so a retried submit cannot
        start a second job."""
        suffix = f"-a{self.attempt}" if self.attempt > 1 else ""
        return f"armature-run-{self.pk}{suffix}"


class RunEvent(models.Model):
    """The run's timeline: state changes, checkpoints, the trainer's own events."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=50)
    message = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "pk"]

    def __str__(self) -> str:
        return f"{self.run_id} {self.kind}"


class TelemetryBatch(models.Model):
    """A message from the trainer's link, stored once per (run, attempt, seq) so a
    resent batch is acknowledged without being stored twice."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="telemetry")
    attempt = models.PositiveIntegerField(default=1)
    seq = models.PositiveBigIntegerField()
    kind = models.CharField(max_length=20)
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "attempt", "seq"], name="unique_run_attempt_seq")
        ]

    def __str__(self) -> str:
        return f"{self.run_id}.{self.attempt}#{self.seq}"


class MetricKey(models.Model):
    """One metric of one run (`rollout/success_rate`): its points refer to it, so the key
    text is stored once per run rather than once per point."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="metric_keys")
    name = models.CharField(max_length=200)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "name"], name="unique_run_key")]

    def __str__(self) -> str:
        return f"{self.run_id} {self.name}"


class MetricPoint(models.Model):
    """A metric's value at a training step (iteration). Series are read per key over a
    step range, so the one index is (key, step); bulk-written (COPY on PostgreSQL)."""

    # The (key, step) index serves the foreign key too. No database constraint: its
    # per-row check was two thirds of a COPY's cost (measured), and key rows go only
    # with their run, whose deletion removes the points first (Django's CASCADE).
    key = models.ForeignKey(
        MetricKey, on_delete=models.CASCADE, db_index=False, db_constraint=False
    )
    step = models.PositiveBigIntegerField()
    value = models.FloatField()
    wall_time = models.FloatField(help_text="Unix seconds when the trainer measured it.")

    class Meta:
        indexes = [models.Index(fields=["key", "step"], name="runs_point_key_step")]

    def __str__(self) -> str:
        return f"{self.key_id}@{self.step}={self.value}"


def parsed_config(text: str) -> dict:
    """A frozen config's text as the mapping `Run.config` keeps; {} when it is none."""
    try:
        parsed = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError:
        return {}
    # What JSON cannot hold (a YAML date) is kept as its text.
    return json.loads(json.dumps(parsed, default=str)) if isinstance(parsed, dict) else {}
