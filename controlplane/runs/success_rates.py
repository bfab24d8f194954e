"""Success rates of a run from its summed counts: overall, per planning horizon and per
task, bucketed like a series (per bucket sum(successes) / sum(episodes), never a mean of
rates), and each task's latest iteration for the table."""

from __future__ import annotations

import math
import re
from collections import defaultdict

from django.db import connection

from controlplane.runs.metric_points import KEYS_TABLE as _KEYS
from controlplane.runs.metric_points import POINTS_TABLE as _POINTS
from controlplane.runs.series import (
    DEFAULT_BUCKETS,
    OVERALL_SUCCESS_KEY,
    StepRange,
    key_extents,
    matching_keys,
    series,
)

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
            low, high, small = key_extents(cursor, ids, StepRange(), buckets)
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
