"""A run's figures as every list shows them: its duration in words a person reads at a
glance (seconds under a minute, not "0 minutes")."""

from datetime import UTC, datetime, timedelta

import pytest

from controlplane.runs.models import Run

START = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(0, "0 s"), (26, "26 s"), (59.9, "59 s"), (60, "1 min 0 s"), (245, "4 min 5 s"),
     (3599, "59 min 59 s"), (7380, "2 h 3 min")],
)  # fmt: skip
def test_durations_read_in_seconds_minutes_or_hours(seconds, shown):
    run = Run(started_at=START, finished_at=START + timedelta(seconds=seconds))
    assert run.duration_text == shown


def test_a_run_not_started_has_no_duration():
    assert Run().duration_text == "—"
