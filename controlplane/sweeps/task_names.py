"""The names the sweeps' Celery tasks are registered under (see runs/task_names.py)."""

ADVANCE = "sweeps.advance"
ADVANCE_ACTIVE = "sweeps.advance_active"
