"""Services queue the runs' tasks by name (controlplane/runs/dispatch.py): every name
they may send is a registered task, and the periodic reconciliation uses the same."""

from celery import current_app
from django.conf import settings

from controlplane.runs import task_names


def test_every_name_dispatch_sends_is_a_registered_task():
    import controlplane.runs.tasks  # noqa: F401  (registers them, as the worker does)

    names = {getattr(task_names, n) for n in dir(task_names) if n.isupper()}
    assert names == {"runs.submit", "runs.reconcile", "runs.reconcile_active", "runs.cancel"}
    assert names <= current_app.tasks.keys()
    schedule = settings.CELERY_BEAT_SCHEDULE["reconcile-active-runs"]
    assert schedule["task"] == task_names.RECONCILE_ACTIVE
