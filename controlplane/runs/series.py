"""A run's metric series: how points are written (in bulk) and every way they are read
(downsampled series, the latest value of every key, success rates from summed counts).

The API views call these functions and nothing else touches the point tables, so each
query has one place to be made fast. Reads are a bounded number of SQL queries whatever
the run's size: bucketing happens in the database, not in Python.
"""

from __future__ import annotations

import io
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from django.db import connection, transaction

from controlplane.runs.models import MetricKey, MetricPoint, Run, RunEvent
from trainer.link.protocol import MAX_METRIC_KEYS_PER_RUN

DEFAULT_BUCKETS = 1000
MAX_BUCKETS = 5000
X_AXES = ("step", "env_steps", "wall_time")
ENV_STEPS_KEY = "charts/env_steps"
OVERALL_SUCCESS_KEY = "rollout/success_rate"
_POINTS = MetricPoint._meta.db_table
_KEYS = MetricKey._meta.db_table


class SeriesQueryError(ValueError):
    """A request the series API cannot answer; the message names what is wrong."""


# --- Writing ---------------------------------------------------------------------------


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
            sql = f"COPY {_POINTS} (key_id, step, value, wall_time) FROM STDIN"
            with cursor.cursor.copy(sql) as copy:
                copy.write(buffer.getvalue())
        return
    MetricPoint.objects.bulk_create(
        [MetricPoint(key_id=k, step=s, value=v, wall_time=t) for k, s, v, t in rows]
    )


# --- Choosing keys -----------------------------------------------------------------------


def parse_keys(text: str | None) -> list[str]:
    """`a,b,prefix/*` → its patterns; a trailing `*` matches every key starting so."""
    patterns = [part.strip() for part in (text or "").split(",") if part.strip()]
    if not patterns:
        raise SeriesQueryError("keys: give one or more keys, comma-separated (prefix/* too).")
    for pattern in patterns:
        if "*" in pattern[:-1]:
            raise SeriesQueryError(f"keys: {pattern!r}: only a trailing * is allowed.")
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


def parse_int(params: Mapping[str, str], name: str, default=None, low=0, high=None):
    """An integer query parameter in [low, high]; a clear error otherwise."""
    text = params.get(name)
    if text in (None, ""):
        return default
    try:
        value = int(text)
    except ValueError:
        raise SeriesQueryError(f"{name}: {text!r} is not an integer.") from None
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise SeriesQueryError(f"{name}: must be {bound}, not {value}.")
    return value


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
        raise SeriesQueryError(f"x: {x!r} is not one of {', '.join(X_AXES)}.")
    if not 1 <= buckets <= MAX_BUCKETS:
        raise SeriesQueryError(f"buckets: must be between 1 and {MAX_BUCKETS}, not {buckets}.")
    keys = matching_keys(run_id, patterns)
    answer: dict = {"run": run_id, "x": x, "last_step": None, "series": {}}
    if not keys:
        return answer
    with connection.cursor() as cursor:
        ids = list(keys)
        if connection.vendor == "postgresql":
            first, last, small = _extent_postgres(cursor, ids, steps, buckets)
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


def _extent_postgres(cursor, ids: list[int], steps: StepRange, buckets: int) -> tuple:
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


# --- Success rates -----------------------------------------------------------------------

_COUNT_KEY = re.compile(
    r"^counts/(?:task(?P<task>[^/]+)/)?(?:h(?P<horizon>\d+)/)?(?P<what>episodes|successes)$"
)
_RATE_KEY = re.compile(
    r"^rollout/(?:success_rate|plan_success_rate_h(?P<horizon>\d+)|success_rate_task_(?P<task>.+))$"
)


def _series_slot() -> dict:
    return {"x": [], "rate": [], "successes": [], "episodes": []}


def success(run_id: int, buckets: int = DEFAULT_BUCKETS) -> dict:
    """Overall, per-horizon and per-task success over the run, bucketed like `series`;
    per bucket sum(successes) / sum(episodes), never a mean of rates. Runs without
    `counts/` keys (older trainers) fall back to the rate keys with episodes unknown."""
    counted = bucket_sums(_charted_count_keys(run_id), buckets)
    if counted:
        return _success_from_counts(counted, _latest_per_task_counts(run_id))
    rated = series(run_id, ["rollout/*"], buckets=buckets)["series"]
    return _success_from_rates(rated)


def _slot_name(match: re.Match) -> tuple[str, str | None, str | None]:
    return match["what"], match["task"], match["horizon"]


def _charted_count_keys(run_id: int) -> dict[int, str]:
    """The count keys the success charts sum: overall, per horizon and per task. The
    task × horizon cells (twice as many keys as the rest in a run of 6 tasks and 3
    horizons) feed only the table, from their latest points."""
    return {
        key_id: name
        for key_id, name in matching_keys(run_id, ["counts/*"]).items()
        if (match := _COUNT_KEY.match(name)) and not (match["task"] and match["horizon"])
    }


def bucket_sums(keys: dict[int, str], buckets: int) -> dict[str, dict[int, float]]:
    """{key name: {bucket's last step: sum of its values}} of the keys ({id: name}),
    bucketed over their steps like `series` (a key with no more points than buckets
    keeps each point as its own): two queries, only sums, which is all the success
    rates need."""
    if not keys:
        return {}
    ids = list(keys)
    marks = ", ".join(["%s"] * len(ids))
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            low, high, small = _extent_postgres(cursor, ids, StepRange(), buckets)
        else:
            cursor.execute(
                f"SELECT key_id, MIN(step), MAX(step), COUNT(*) FROM {_POINTS} "
                f"WHERE key_id IN ({marks}) GROUP BY key_id",
                ids,
            )
            extents = cursor.fetchall()
            low = min((row[1] for row in extents), default=None)
            high = max((row[2] for row in extents), default=None)
            small = [key_id for key_id, _, _, count in extents if count <= buckets]
        if low is None:
            return {}
        small = small or [-1]
        small_marks = ", ".join(["%s"] * len(small))
        cursor.execute(
            f"""
            SELECT key_id, MAX(step), SUM(value) FROM {_POINTS}
            WHERE key_id IN ({marks})
            GROUP BY key_id,
                     CASE WHEN key_id IN ({small_marks}) THEN step
                          ELSE (step - %s) * %s / %s END
            """,
            [*ids, *small, low, buckets, high - low + 1],
        )
        sums: dict[str, dict[int, float]] = defaultdict(dict)
        for key_id, last_step, total in cursor.fetchall():
            sums[keys[key_id]][last_step] = total
    return sums


def _rate_slot(successes: dict[int, float], episodes: dict[int, float]) -> dict:
    slot = _series_slot()
    for x in sorted(episodes):
        total = episodes[x]
        won = successes.get(x, 0.0)
        slot["x"].append(x)
        slot["successes"].append(_count(won))
        slot["episodes"].append(_count(total))
        slot["rate"].append(won / total if total else None)
    return slot


def _count(value: float) -> int | float:
    return int(round(value)) if math.isclose(value, round(value)) else value


def _success_from_counts(counted: dict, table_rows: list[dict]) -> dict:
    sums: dict[tuple[str | None, str | None], dict[str, dict[int, float]]] = defaultdict(dict)
    for name, per_bucket in counted.items():
        match = _COUNT_KEY.match(name)
        if match:
            what, task, horizon = _slot_name(match)
            sums[(task, horizon)][what] = per_bucket

    def slot(task, horizon) -> dict:
        found = sums.get((task, horizon), {})
        return _rate_slot(found.get("successes", {}), found.get("episodes", {}))

    horizons = sorted({h for t, h in sums if t is None and h is not None}, key=int)
    tasks = sorted({t for t, h in sums if t is not None}, key=_natural)
    return {
        "overall": slot(None, None),
        "horizons": {h: slot(None, h) for h in horizons},
        "tasks": {t: slot(t, None) for t in tasks},
        "table": table_rows,
    }


def _latest_per_task_counts(run_id: int) -> list[dict]:
    """Each task's latest iteration: its counts and rate, and its per-horizon rates."""
    found = latest_matching(run_id, "counts/task")
    per_task: dict[str, dict] = {}
    for name, point in found.items():
        match = _COUNT_KEY.match(name)
        if not match or match["task"] is None:
            continue
        row = per_task.setdefault(match["task"], {"step": -1, "counts": defaultdict(dict)})
        row["step"] = max(row["step"], point["step"])
        row["counts"][match["horizon"]][match["what"]] = point
    table = []
    for task in sorted(per_task, key=_natural):
        row = per_task[task]
        step = row["step"]

        def at_step(counts: dict, what: str, step=step) -> float | None:
            point = counts.get(what)
            return point["value"] if point and point["step"] == step else None

        overall = row["counts"].get(None, {})
        episodes, successes = at_step(overall, "episodes"), at_step(overall, "successes")
        horizons = {}
        for horizon, counts in row["counts"].items():
            h_episodes, h_successes = at_step(counts, "episodes"), at_step(counts, "successes")
            if horizon is not None and h_episodes:
                horizons[horizon] = (h_successes or 0.0) / h_episodes
        table.append({
            "task": task, "step": step,
            "rate": (successes or 0.0) / episodes if episodes else None,
            "successes": _count(successes) if successes is not None else None,
            "episodes": _count(episodes) if episodes is not None else None,
            "horizons": dict(sorted(horizons.items(), key=lambda item: int(item[0]))),
        })  # fmt: skip
    return table


def latest_matching(run_id: int, prefix: str) -> dict[str, dict]:
    """`latest` restricted to keys starting with `prefix` (one query)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT k.name, p.step, p.value FROM {_KEYS} k JOIN {_POINTS} p ON p.id = (
                SELECT q.id FROM {_POINTS} q WHERE q.key_id = k.id
                ORDER BY q.step DESC, q.id DESC LIMIT 1
            )
            WHERE k.run_id = %s AND k.name LIKE %s ESCAPE '\\'
            """,
            [run_id, prefix.replace("%", r"\%").replace("_", r"\_") + "%"],
        )
        return {name: {"step": step, "value": value} for name, step, value in cursor.fetchall()}


def _success_from_rates(rated: dict) -> dict:
    """Older runs: the trainer's rates per bucket (its last value), episodes unknown."""

    def slot(one: dict | None) -> dict:
        if one is None:
            return _series_slot()
        n = len(one["x"])
        return {"x": one["x"], "rate": one["last"], "successes": [None] * n, "episodes": [None] * n}

    horizons, tasks, table = {}, {}, []
    for name, one in rated.items():
        match = _RATE_KEY.match(name)
        if not match:
            continue
        if match["horizon"]:
            horizons[match["horizon"]] = slot(one)
        elif match["task"]:
            tasks[match["task"]] = slot(one)
            table.append({
                "task": match["task"], "step": one["x"][-1], "rate": one["last"][-1],
                "successes": None, "episodes": None, "horizons": {},
            })  # fmt: skip
    return {
        "overall": slot(rated.get(OVERALL_SUCCESS_KEY)),
        "horizons": dict(sorted(horizons.items(), key=lambda item: int(item[0]))),
        "tasks": dict(sorted(tasks.items(), key=lambda item: _natural(item[0]))),
        "table": sorted(table, key=lambda row: _natural(row["task"])),
    }


def _natural(text: str) -> tuple:
    """Task ids sort as numbers when they are numbers (2 before 10)."""
    return (0, int(text), "") if text.isdigit() else (1, 0, text)


# --- Requests (query parameters → answers) ------------------------------------------------

DEFAULT_POINTS_PAGE, MAX_POINTS_PAGE = 1000, 10000
DEFAULT_PAGE, MAX_PAGE = 200, 1000


def series_request(run_id: int, params: Mapping[str, str]) -> dict:
    start = parse_int(params, "start")
    end = parse_int(params, "end")
    if start is not None and end is not None and start > end:
        raise SeriesQueryError(f"start ({start}) is after end ({end}).")
    return series(
        run_id,
        parse_keys(params.get("keys")),
        x=params.get("x") or "step",
        steps=StepRange(start, end),
        buckets=parse_int(params, "buckets", DEFAULT_BUCKETS, low=1, high=MAX_BUCKETS),
    )


def success_request(run_id: int, params: Mapping[str, str]) -> dict:
    return success(run_id, parse_int(params, "buckets", DEFAULT_BUCKETS, low=1, high=MAX_BUCKETS))


def points_page(run_id: int, key: str, params: Mapping[str, str]) -> dict:
    """One key's raw points by step after the `after` step, at most `limit` of them;
    `next_after` is the cursor for the next page (null on the last)."""
    after = parse_int(params, "after", -1, low=-1)
    limit = parse_int(params, "limit", DEFAULT_POINTS_PAGE, low=1, high=MAX_POINTS_PAGE)
    points = list(
        MetricPoint.objects.filter(key__run_id=run_id, key__name=key, step__gt=after)
        .order_by("step", "pk")
        .values("step", "value", "wall_time")[: limit + 1]
    )
    more = len(points) > limit
    points = points[:limit]
    return {"key": key, "points": points, "next_after": points[-1]["step"] if more else None}


def events_page(run_id: int, params: Mapping[str, str]) -> dict:
    """The run's events after the event id `after`, oldest first, at most `limit`."""
    after = parse_int(params, "after", 0)
    limit = parse_int(params, "limit", DEFAULT_PAGE, low=1, high=MAX_PAGE)
    events = list(
        RunEvent.objects.filter(run_id=run_id, pk__gt=after)
        .order_by("pk")
        .values("id", "kind", "message", "data", "created_at")[: limit + 1]
    )
    more = len(events) > limit
    events = events[:limit]
    return {"results": events, "next_after": events[-1]["id"] if more else None}
