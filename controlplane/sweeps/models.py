"""Sweeps and their trials. Optuna keeps its own record of the study (its tables in the
same database, `storage.py`); these rows are what pages, the API and permissions read,
and each trial points at the ordinary run it launched."""

from django.conf import settings
from django.db import models


class SweepState(models.TextChoices):
    RUNNING = "running"
    FINISHED = "finished"  # every trial of the budget ended, or the wall time ran out
    CANCELLED = "cancelled"


class TrialState(models.TextChoices):
    RUNNING = "running"  # its run is launched (queued, submitting or training)
    COMPLETE = "complete"
    PRUNED = "pruned"  # stopped early by the pruner, through the run's cancel
    FAILED = "failed"  # its run failed, timed out, was stopped by hand, or refused
    CANCELLED = "cancelled"  # the sweep was cancelled (or ran out of time) under it


TRIAL_ENDED = frozenset(
    {TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAILED, TrialState.CANCELLED}
)


class Sweep(models.Model):
    experiment = models.ForeignKey(
        "experiments.Experiment", on_delete=models.PROTECT, related_name="sweeps"
    )
    revision = models.ForeignKey("experiments.Revision", on_delete=models.PROTECT)
    cluster = models.ForeignKey(
        "inventory.Cluster", null=True, blank=True, on_delete=models.SET_NULL
    )
    spec_yaml = models.TextField(help_text="The sweep as written (space, objective, budget).")
    spec = models.JSONField(help_text="The same, checked and with its defaults.")
    # Optuna's study, in its tables of this database: unique across test databases that
    # are flushed but keep Optuna's tables.
    study_name = models.CharField(max_length=100, unique=True)
    state = models.CharField(max_length=20, choices=SweepState.choices, default=SweepState.RUNNING)
    reason = models.TextField(blank=True, help_text="Why the sweep ended.")
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    # One advance at a time (progress.py): whoever holds an unexpired lease. A lease, not
    # a row lock held across the step, as Optuna writes through connections of its own.
    lease_until = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    # A client's retried request makes no second sweep (as for runs).
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["created_by", "idempotency_key"], name="unique_sweep_idempotency_key"
            )
        ]

    def __str__(self) -> str:
        return f"sweep {self.pk} ({self.experiment.name})"

    @property
    def is_final(self) -> bool:
        return self.state != SweepState.RUNNING


class Trial(models.Model):
    sweep = models.ForeignKey(Sweep, on_delete=models.CASCADE, related_name="trials")
    number = models.PositiveIntegerField(help_text="Optuna's trial number in the study.")
    params = models.JSONField(help_text="Key path → the value this trial runs with.")
    run = models.OneToOneField(
        "runs.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="trial"
    )
    # With an evaluation's objective: the eval run of the trial's last checkpoint.
    eval_run = models.OneToOneField(
        "runs.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="eval_trial"
    )
    state = models.CharField(max_length=20, choices=TrialState.choices, default=TrialState.RUNNING)
    value = models.FloatField(
        null=True, blank=True, help_text="The objective: final, or the latest reported."
    )
    # The run's last step reported to Optuna as an intermediate value (pruning).
    reported_step = models.BigIntegerField(null=True, blank=True)
    reason = models.TextField(blank=True, help_text="Why the trial failed or was stopped.")
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["number"]
        constraints = [
            models.UniqueConstraint(fields=["sweep", "number"], name="unique_sweep_trial")
        ]

    def __str__(self) -> str:
        return f"sweep {self.sweep_id} trial {self.number}"

    @property
    def has_ended(self) -> bool:
        return self.state in TRIAL_ENDED
