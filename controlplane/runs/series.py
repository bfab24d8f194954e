"""Reading a run's metric series: downsampled series of chosen keys, every key's latest
value, one key's raw points a page at a time.

The API views call these functions (and success_rates.py's) and nothing else reads the
point tables, so each query has one place to be made fast. Reads are a bounded number of
SQL queries whatever the run's size: bucketing happens in the database, not in Python.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection

from controlplane.runs.metric_points import KEYS_TABLE as _KEYS
from controlplane.runs.metric_points import POINTS_TABLE as _POINTS
from controlplane.runs.models import MetricKey, MetricPoint

DEFAULT_BUCKETS = 1000
MAX_BUCKETS = 5000
X_AXES = ("step", "env_steps", "wall_time")
ENV_STEPS_KEY = "charts/env_steps"
OVERALL_SUCCESS_KEY = "rollout/success_rate"
DEFAULT_POINTS_PAGE, MAX_POINTS_PAGE = 1000, 10000


class QueryError(ValueError):
    """A read these functions cannot answer; the message names the parameter."""


# --- Choosing keys -----------------------------------------------------------------------


def parse_keys(text: str | None) -> list[str]:
    """`a,b,prefix/*` → its patterns; a trailing `*` matches every key starting so."""
    patterns = [part.strip() for part in (text or "").split(",") if part.strip()]
    if not patterns:
        raise QueryError("keys: give one or more keys, comma-separated (prefix/* too).")
    for pattern in patterns:
        if "*" in pattern[:-1]:
            raise QueryError(f"keys: {pattern!r}: only a trailing * is allowed.")
    return patterns


def matching_keys(run_id: int, patterns: list[str]) -> dict[int, str]:
    """{key id: name} of the run's keys matching the patterns, in one query."""
    names = MetricKey.objects.filter(run_id=run_id).values_list("id", "name")
    exact = {p for p in patterns if not p.endswith("*")}
    prefixes = tuple(p[:-1] for p in patterns if p.endswith("*"))
    return {
        key_id: name
        for key_id, name in names
        if name in exact or (prefixes and name.startswith(prefixes))
    }


# --- Series ------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepRange:
    start: int | None = None
    end: int | None = None


def series(
    run_id: int,
    patterns: list[str],
    x: str = "step",
    steps: StepRange = StepRange(),  # noqa: B008 (frozen)
    buckets: int = DEFAULT_BUCKETS,
) -> dict:
    """The matching keys' points over the step range, at most `buckets` per key, each
    bucket's min/max/mean/last (so a one-step spike survives as the bucket's max) and
    count. A key with no more points than buckets keeps every point as its own bucket."""
    if x not in X_AXES:
        raise QueryError(f"x: {x!r} is not one of {', '.join(X_AXES)}.")
    if not 1 <= buckets <= MAX_BUCKETS:
        raise QueryError(f"buckets: must be between 1 and {MAX_BUCKETS}, not {buckets}.")
    keys = matching_keys(run_id, patterns)
    answer: dict = {"run": run_id, "x": x, "last_step": None, "series": {}}
    if not keys:
        return answer
    with connection.cursor() as cursor:
        ids = list(keys)
        if connection.vendor == "postgresql":
            first, last, small = key_extents(cursor, ids, steps, buckets)
        else:
            marks = ", ".join(["%s"] * len(ids))
            cursor.execute(
                f"SELECT MIN(step), MAX(step) FROM {_POINTS} WHERE key_id IN ({marks})", ids
            )
            (first, last), small = cursor.fetchone(), None
        if last is None:
            return answer
        answer["last_step"] = last
        low = first if steps.start is None else max(first, steps.start)
        high = last if steps.end is None else min(last, steps.end)
        if low > high:
            return answer
        env_id = _env_steps_id(keys, run_id) if x == "env_steps" else None
        if small is None:
            cursor.execute(*_bucket_sql(ids, low, high, buckets, x, env_id))
            rows = cursor.fetchall()
        else:
            cursor.execute(*_bucket_sql_postgres(ids, small, low, high, buckets, x, env_id))
            rows = cursor.fetchall()
    out = {
        name: {f: [] for f in ("x", "min", "max", "mean", "last", "count")}
        for name in keys.values()
    }
    for key_id, last_step, low_v, high_v, mean, last_v, last_wall, count, env_steps in rows:
        one = out[keys[key_id]]
        one["x"].append(last_step if x == "step" else last_wall if x == "wall_time" else env_steps)
        one["min"].append(low_v)
        one["max"].append(high_v)
        one["mean"].append(mean)
        one["last"].append(last_v)
        one["count"].append(count)
    answer["series"] = {name: one for name, one in out.items() if one["x"]}
    return answer


def _env_steps_id(keys: dict[int, str], run_id: int) -> int | None:
    for key_id, name in keys.items():
        if name == ENV_STEPS_KEY:
            return key_id
    return (
        MetricKey.objects.filter(run_id=run_id, name=ENV_STEPS_KEY)
        .values_list("id", flat=True)
        .first()
    )


def key_extents(cursor, ids: list[int], steps: StepRange, buckets: int) -> tuple:
    """The keys' first and last step, and which keys have no more points than buckets
    in the requested range (those keep every point as its own bucket). Index probes per
    key: its first and last entry, and at most `buckets + 1` entries counted, so the
    cost does not grow with the run's length."""
    start = -(2**62) if steps.start is None else steps.start
    end = 2**62 if steps.end is None else steps.end
    cursor.execute(
        f"""
        SELECT k.id,
               (SELECT MIN(step) FROM {_POINTS} WHERE key_id = k.id),
               (SELECT MAX(step) FROM {_POINTS} WHERE key_id = k.id),
               (SELECT COUNT(*) FROM (
                    SELECT 1 FROM {_POINTS} WHERE key_id = k.id AND step BETWEEN %s AND %s
                    LIMIT %s) counted)
        FROM unnest(%s::bigint[]) AS k(id)
        """,
        [start, end, buckets + 1, ids],
    )
    rows = [row for row in cursor.fetchall() if row[1] is not None]
    if not rows:
        return None, None, []
    small = [key_id for key_id, _, _, count in rows if count <= buckets]
    return min(row[1] for row in rows), max(row[2] for row in rows), small


def _env_steps_at(x: str, env_id) -> str:
    """For x=env_steps: the env-steps counter at the bucket's last step (or just before)."""
    if x != "env_steps" or env_id is None:
        return "NULL"
    return (
        f"(SELECT e.value FROM {_POINTS} e WHERE e.key_id = %s AND e.step <= b.last_step "
        "ORDER BY e.step DESC LIMIT 1)"
    )


def _bucket_sql_postgres(
    ids: list[int], small: list[int], low: int, high: int, buckets: int, x: str, env_id
) -> tuple:
    """`_bucket_sql`'s answer in one hash aggregate, without sorting the points: each
    bucket's last point is the greatest `[step, id, value, wall_time]` array (step
    first, then the later row of a step stored twice), which PostgreSQL's MAX compares
    element by element. Steps and ids are exact in float8 up to 2**53."""
    env_steps = _env_steps_at(x, env_id)
    sql = f"""
        SELECT b.key_id, b.last_step, b.low, b.high, b.mean, b.last_value, b.last_wall, b.n,
               {env_steps}
        FROM (
            SELECT key_id, low, high, mean, n, last_row[1]::bigint AS last_step,
                   last_row[3] AS last_value, last_row[4] AS last_wall
            FROM (
                SELECT key_id, MIN(value) AS low, MAX(value) AS high, AVG(value) AS mean,
                       COUNT(*) AS n,
                       MAX(ARRAY[step::float8, id::float8, value, wall_time]) AS last_row
                FROM {_POINTS}
                WHERE key_id = ANY(%s) AND step BETWEEN %s AND %s
                GROUP BY key_id,
                         CASE WHEN key_id = ANY(%s) THEN step
                              ELSE (step - %s) * %s / %s END
            ) grouped
        ) b
        ORDER BY b.key_id, b.last_step
    """
    params = ([env_id] if env_steps != "NULL" else []) + [ids, low, high]
    return sql, params + [small, low, buckets, high - low + 1]


def _bucket_sql(ids: list[int], low: int, high: int, buckets: int, x: str, env_id) -> tuple:
    """One query: each key's points in [low, high] numbered into buckets (every point its
    own bucket when the key has no more points than buckets), then per bucket its
    min/max/mean/count and the last point's value and wall time (row_number picks it, so
    a step stored twice by a resumed attempt still gives one last)."""
    span = high - low + 1
    marks = ", ".join(["%s"] * len(ids))
    env_steps = _env_steps_at(x, env_id)
    sql = f"""
        SELECT b.key_id, b.last_step, b.low, b.high, b.mean, b.last_value, b.last_wall, b.n,
               {env_steps}
        FROM (
            SELECT key_id, bucket, MIN(value) AS low, MAX(value) AS high, AVG(value) AS mean,
                   COUNT(*) AS n, MAX(step) AS last_step,
                   MAX(CASE WHEN rn = 1 THEN value END) AS last_value,
                   MAX(CASE WHEN rn = 1 THEN wall_time END) AS last_wall
            FROM (
                SELECT key_id, step, value, wall_time, bucket,
                       ROW_NUMBER() OVER (
                           PARTITION BY key_id, bucket ORDER BY step DESC, id DESC
                       ) AS rn
                FROM (
                    SELECT id, key_id, step, value, wall_time,
                           CASE WHEN COUNT(*) OVER (PARTITION BY key_id) <= %s THEN step
                                ELSE (step - %s) * %s / %s END AS bucket
                    FROM {_POINTS}
                    WHERE key_id IN ({marks}) AND step BETWEEN %s AND %s
                ) numbered
            ) ranked
            GROUP BY key_id, bucket
        ) b
        ORDER BY b.key_id, b.last_step
    """
    params = ([env_id] if env_steps != "NULL" else []) + [buckets, low, buckets, span]
    return sql, params + ids + [low, high]


# --- Latest values -----------------------------------------------------------------------


def latest(run_id: int) -> dict:
    """Every key's point at its highest step, in one query (an index probe per key)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT k.name, p.step, p.value, p.wall_time
            FROM {_KEYS} k JOIN {_POINTS} p ON p.id = (
                SELECT q.id FROM {_POINTS} q WHERE q.key_id = k.id
                ORDER BY q.step DESC, q.id DESC LIMIT 1
            )
            WHERE k.run_id = %s
            """,
            [run_id],
        )
        rows = cursor.fetchall()
    values = {
        name: {"step": step, "value": value, "wall_time": wall} for name, step, value, wall in rows
    }
    step = max((v["step"] for v in values.values()), default=None)
    return {"step": step, "values": values}


# --- Raw points ----------------------------------------------------------------------------


def points_page(run_id: int, key: str, after: int = -1, limit: int = DEFAULT_POINTS_PAGE) -> dict:
    """One key's raw points by step after the `after` step, at most `limit` of them;
    `next_after` is the cursor for the next page (null on the last)."""
    points = list(
        MetricPoint.objects.filter(key__run_id=run_id, key__name=key, step__gt=after)
        .order_by("step", "pk")
        .values("step", "value", "wall_time")[: limit + 1]
    )
    more = len(points) > limit
    points = points[:limit]
    return {"key": key, "points": points, "next_after": points[-1]["step"] if more else None}
