"""Writing a run's metric points: key rows (capped per run) and the points in bulk
(COPY on PostgreSQL, one multi-row INSERT elsewhere). Reading them is series.py's and
success_rates.py's."""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping

from django.db import connection, transaction

from controlplane.runs.models import MetricKey, MetricPoint, Run
from trainer.link.protocol import MAX_METRIC_KEYS_PER_RUN

POINTS_TABLE = MetricPoint._meta.db_table
KEYS_TABLE = MetricKey._meta.db_table


def key_ids(
    run_id: int,
    names: Iterable[str],
    known: dict[str, int] | None = None,
    refused: set[str] | None = None,
) -> dict:
    """The key row id of each name for the run, creating the missing ones while the run
    has fewer than MAX_METRIC_KEYS_PER_RUN keys (in the order given); a name past that
    cap gets no row and no id, and is added to `refused`. `known` is a caller's cache
    (one trainer link's keys): hits cost no query."""
    known = {} if known is None else known
    missing = [name for name in dict.fromkeys(names) if name not in known]
    if missing:
        found = dict(
            MetricKey.objects.filter(run_id=run_id, name__in=missing).values_list("name", "id")
        )
        absent = [name for name in missing if name not in found]
        if absent:
            admitted = _admit_keys(run_id, absent)
            found.update(
                MetricKey.objects.filter(run_id=run_id, name__in=admitted).values_list("name", "id")
            )
            if refused is not None:
                refused.update(name for name in absent if name not in found)
        known.update(found)
    return known


def _admit_keys(run_id: int, names: list[str]) -> list[str]:
    """Create the rows of as many of `names` as the run's key cap leaves room for;
    returns those names (rows another writer made meanwhile are re-read by the caller)."""
    with transaction.atomic():
        # The run's row, locked (FOR NO KEY UPDATE: inserts referring to the run still
        # go on) while its keys are counted and made, so two writers of one run cannot
        # both take the last places under the cap.
        list(Run.objects.select_for_update(no_key=True).filter(pk=run_id).values_list("pk"))
        room = MAX_METRIC_KEYS_PER_RUN - MetricKey.objects.filter(run_id=run_id).count()
        admitted = names[: max(room, 0)]
        # Two links of one run may race to create a key: the loser re-reads it.
        MetricKey.objects.bulk_create(
            [MetricKey(run_id=run_id, name=name) for name in admitted], ignore_conflicts=True
        )
    return admitted


def store_points(
    run_id: int,
    step: int,
    wall_time: float,
    values: Mapping[str, float],
    known_keys: dict[str, int] | None = None,
) -> None:
    """Store one step's values: COPY on PostgreSQL, one multi-row INSERT elsewhere."""
    copy_points(point_rows(run_id, step, wall_time, values, known_keys))


def point_rows(
    run_id: int,
    step: int,
    wall_time: float,
    values: Mapping[str, float],
    known_keys: dict[str, int] | None = None,
    refused: set[str] | None = None,
) -> list[tuple[int, int, float, float]]:
    """One step's values as (key_id, step, value, wall_time) rows for `copy_points`,
    creating the key rows it needs; the values of keys past the run's key cap are left
    out (their names added to `refused`)."""
    if not values:
        return []
    ids = key_ids(run_id, values, known_keys, refused)
    return [
        (ids[name], step, float(value), wall_time) for name, value in values.items() if name in ids
    ]


def copy_points(rows: list[tuple[int, int, float, float]]) -> None:
    """Insert (key_id, step, value, wall_time) rows in one statement."""
    if not rows:
        return
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            # COPY text format: repr() of a float is exact and parses back the same.
            buffer = io.StringIO()
            for key_id, step, value, wall_time in rows:
                buffer.write(f"{key_id}\t{step}\t{value!r}\t{wall_time!r}\n")
            sql = f"COPY {POINTS_TABLE} (key_id, step, value, wall_time) FROM STDIN"
            with cursor.cursor.copy(sql) as copy:
                copy.write(buffer.getvalue())
        return
    MetricPoint.objects.bulk_create(
        [MetricPoint(key_id=k, step=s, value=v, wall_time=t) for k, s, v, t in rows]
    )
