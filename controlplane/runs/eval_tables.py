"""Reading evaluations: an eval run's per-task table (the newest `evaluated` event its
trainer reported, stored as the link delivered it), a run's evaluations with their
averages, and tables side by side — a column per evaluation, a row per task — for a run's
page and the compare page. Every read is a fixed number of queries."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from controlplane.runs.frozen_config import ConfigError, frozen_section
from controlplane.runs.models import EVAL_SUCCESS_KEY, Run, RunEvent, RunKind, RunState

EVALUATED = "evaluated"  # the link's event kind carrying the table
SHOWN_COLUMNS = 12  # a run page's side-by-side table shows its newest evaluations


def tables_of(run_ids: Iterable[int]) -> dict[int, dict[str, Any]]:
    """Each run's newest table (trainer.link.protocol.EvalTableData), in one query."""
    events = (
        RunEvent.objects.filter(run_id__in=list(run_ids), kind=EVALUATED)
        .order_by("run_id", "-created_at", "-pk")
        .values_list("run_id", "data")
    )
    tables: dict[int, dict[str, Any]] = {}
    for run_id, data in events:
        tables.setdefault(run_id, data)
    return tables


def table_of(run: Run) -> dict[str, Any] | None:
    return tables_of([run.pk]).get(run.pk)


@dataclass(frozen=True)
class Evaluation:
    """One eval run as its source's page and the API list it."""

    run: Run
    table: dict[str, Any] | None

    @property
    def average(self) -> float | None:
        return self.table["average"] if self.table else self.run.summary.get(EVAL_SUCCESS_KEY)

    @property
    def benchmark(self) -> tuple[str, str | None]:
        """(env, suite) it runs on: the table's, or before it the request's."""
        if self.table:
            return self.table["env"], self.table["suite"]
        return _planned_benchmark(self.run)

    def to_json(self) -> dict[str, Any]:
        options = self.run.eval_options or {}
        env, suite = self.benchmark
        return {
            "id": self.run.pk,
            "state": self.run.state,
            "checkpoint": self.run.source_iteration,
            "env": env,
            "suite": suite,
            "tasks": options.get("tasks"),
            "states": options.get("states"),
            "average": self.average,
            "horizon_average": (self.table or {}).get("horizon_average", {}),
            "created_at": self.run.created_at.isoformat(),
            "finished_at": self.run.finished_at.isoformat() if self.run.finished_at else None,
        }


def evaluations_of(source: Run) -> list[Evaluation]:
    """The eval runs of `source`, newest first, with their tables: two queries."""
    runs = list(source.evaluations.filter(kind=RunKind.EVAL).order_by("-created_at", "-pk"))
    tables = tables_of(run.pk for run in runs)
    return [Evaluation(run, tables.get(run.pk)) for run in runs]


def _planned_benchmark(run: Run) -> tuple[str, str | None]:
    try:
        env = frozen_section(run, "env")
    except ConfigError:  # the run page says so once; the table names what it can
        env = {}
    suite = (run.eval_options or {}).get("suite") or env.get("suite")
    return str(env.get("name", "?")), suite


# ----- one table, and several side by side ---------------------------------------------


def _cell(successes: int, episodes: int, rate: float) -> dict[str, Any]:
    # The hue runs from red (0) to green (1), as the run page's heatmap does.
    return {"successes": successes, "episodes": episodes, "rate": rate, "hue": round(rate * 120)}


@dataclass(frozen=True)
class TableView:
    """An eval run's table laid out for its page: a row per task with a cell per
    horizon, then the averages."""

    table: dict[str, Any]
    horizons: list[int]
    rows: list[dict[str, Any]]
    average: dict[str, Any]
    horizon_averages: list[dict[str, Any] | None]


def table_view(table: dict[str, Any]) -> TableView:
    horizons = [int(h) for h in table["horizons"]] if len(table["horizons"]) > 1 else []
    rows = []
    for task in table["tasks"]:
        per = task["per_horizon"]
        rows.append({
            "task_id": task["task_id"],
            "name": task["name"],
            **_cell(task["successes"], task["episodes"], task["rate"]),
            "horizons": [
                {**_cell(**per[str(h)]), "horizon": h} if str(h) in per else None
                for h in horizons
            ],
        })  # fmt: skip
    successes = sum(task["successes"] for task in table["tasks"])
    episodes = sum(task["episodes"] for task in table["tasks"])
    averages = table["horizon_average"]
    return TableView(
        table=table,
        horizons=horizons,
        rows=rows,
        average=_cell(successes, episodes, table["average"]),
        horizon_averages=[
            _rate_cell(averages[str(h)]) if str(h) in averages else None for h in horizons
        ],
    )


def _rate_cell(rate: float) -> dict[str, Any]:
    return {"rate": rate, "hue": round(rate * 120)}


@dataclass(frozen=True)
class Column:
    """One evaluation in a side-by-side table."""

    title: str  # "run 12"
    detail: str  # "iter 60 · eval run 14"
    eval_run: Run
    table: dict[str, Any]


@dataclass
class SideBySide:
    """Evaluations on one benchmark (env and suite): a column each, a row per task."""

    env: str
    suite: str | None
    columns: list[Column] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    averages: list[dict[str, Any]] = field(default_factory=list)
    horizon_rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def title(self) -> str:
        return f"{self.env} / {self.suite}" if self.suite else self.env


def side_by_side(columns: list[Column]) -> list[SideBySide]:
    """The columns grouped by benchmark, in order of first appearance; each group's rows
    are the union of its columns' tasks (a cell is None where a column lacks the task),
    then the suite averages and, where tables have several horizons, each horizon's."""
    groups: dict[tuple[str, str | None], SideBySide] = {}
    for column in columns:
        key = (column.table["env"], column.table["suite"])
        groups.setdefault(key, SideBySide(*key)).columns.append(column)
    for group in groups.values():
        per_column = [{t["task_id"]: t for t in c.table["tasks"]} for c in group.columns]
        names = {tid: task["name"] for tasks in reversed(per_column) for tid, task in tasks.items()}
        for task_id in sorted(names):
            found = [tasks.get(task_id) for tasks in per_column]
            cells = [_cell(t["successes"], t["episodes"], t["rate"]) if t else None for t in found]
            group.rows.append({"task_id": task_id, "name": names[task_id], "cells": cells})
        group.averages = [_rate_cell(c.table["average"]) for c in group.columns]
        horizons = sorted({int(h) for c in group.columns for h in c.table["horizon_average"]})
        if len(horizons) > 1:
            group.horizon_rows = [
                {
                    "horizon": h,
                    "cells": [
                        _rate_cell(c.table["horizon_average"][str(h)])
                        if str(h) in c.table["horizon_average"]
                        else None
                        for c in group.columns
                    ],
                }
                for h in horizons
            ]
    return list(groups.values())


def checkpoints_side_by_side(evaluations: list[Evaluation]) -> list[SideBySide]:
    """A run's finished evaluations (the newest SHOWN_COLUMNS), a column each, oldest
    checkpoint first: how its success grew over training."""
    done = [e for e in evaluations if e.table and e.run.state == RunState.SUCCEEDED]
    done = sorted(done[:SHOWN_COLUMNS], key=lambda e: (e.run.source_iteration or 0, e.run.pk))
    return side_by_side([
        Column(f"iter {e.run.source_iteration}", f"run {e.run.pk}", e.run, e.table)
        for e in done
    ])  # fmt: skip


def compared_evaluations(runs: list[Run]) -> list[SideBySide]:
    """The compare page's tables: a column per compared run and benchmark — an eval
    run's own table, or a training run's newest finished evaluation on that benchmark.
    Three queries whatever the number of runs."""
    train_ids = [run.pk for run in runs if not run.is_eval]
    evals = list(
        Run.objects.filter(source_run__in=train_ids, kind=RunKind.EVAL, state=RunState.SUCCEEDED)
        .order_by("-created_at", "-pk")
    )  # fmt: skip
    tables = tables_of([run.pk for run in runs if run.is_eval] + [run.pk for run in evals])
    newest: dict[int, dict[tuple[str, str | None], Run]] = {}
    for evaluation in evals:
        table = tables.get(evaluation.pk)
        if table is not None:
            per_benchmark = newest.setdefault(evaluation.source_run_id, {})
            per_benchmark.setdefault((table["env"], table["suite"]), evaluation)
    columns = []
    for run in runs:
        if run.is_eval:
            if run.pk in tables:
                detail = f"run {run.source_run_id} at iter {run.source_iteration}"
                columns.append(Column(f"run {run.pk}", detail, run, tables[run.pk]))
            continue
        for evaluation in newest.get(run.pk, {}).values():
            detail = f"iter {evaluation.source_iteration} · eval run {evaluation.pk}"
            columns.append(Column(f"run {run.pk}", detail, evaluation, tables[evaluation.pk]))
    return side_by_side(columns)
