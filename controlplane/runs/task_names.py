"""The names the runs' Celery tasks are registered under (`tasks.py` declares each task
with its name from here). Services queue work by name (`dispatch`), so they never import
the tasks, which import the services."""

SUBMIT = "runs.submit"
RECONCILE = "runs.reconcile"
RECONCILE_ACTIVE = "runs.reconcile_active"
CANCEL = "runs.cancel"
