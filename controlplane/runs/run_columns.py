"""The runs list's chosen columns, as W&B's runs table has them: any config key
(`config:runner.iterations`) or logged metric (`metric:rollout/success_rate`, its last
value), shown for each run and sortable across every run the filters keep (`sort=spec`
or `sort=-spec`, unless the query names an `ordering`), in the database: one query per
page whatever the columns."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from django.db.models import F, OuterRef, QuerySet, Subquery
from django.db.models.fields.json import KeyTransform
from django.http import QueryDict

from controlplane.runs.models import MetricKey, MetricPoint, Run
from trainer.config.addresses import redact_urls_in

CONFIG, METRIC = "config", "metric"
MAX_COLUMNS = 8
CONFIG_KEY = re.compile(r"[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*")
MAX_SPEC = 200
# Metric names the column picker offers at most.
MAX_OFFERED = 500


class ColumnError(ValueError):
    pass


@dataclass(frozen=True)
class Column:
    kind: str  # CONFIG or METRIC
    key: str

    @property
    def spec(self) -> str:
        return f"{self.kind}:{self.key}"

    @property
    def field(self) -> str:
        """The annotation that holds its value."""
        return "column_" + hashlib.sha1(self.spec.encode()).hexdigest()[:12]

    def value(self, run: Run) -> Any:
        if self.kind == METRIC:
            return getattr(run, self.field, None)
        node: Any = run.config
        for part in self.key.split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node


def parse_column(spec: str) -> Column:
    """A column from its spec; raises ColumnError naming what is wrong."""
    kind, _, key = spec.partition(":")
    if kind not in (CONFIG, METRIC) or not key:
        raise ColumnError(f"column {spec!r}: write config:<dotted.key> or metric:<name>")
    if len(spec) > MAX_SPEC:
        raise ColumnError(f"column {spec[:40]!r}…: at most {MAX_SPEC} characters")
    if kind == CONFIG and not CONFIG_KEY.fullmatch(key):
        raise ColumnError(f"column {spec!r}: a config key is names joined by dots")
    return Column(kind, key)


def chosen_columns(specs: list[str]) -> tuple[list[Column], list[str]]:
    """The columns named (each once, at most MAX_COLUMNS) and what was wrong with the
    others."""
    columns: list[Column] = []
    problems: list[str] = []
    for spec in specs:
        if not spec.strip():  # the picker left empty
            continue
        try:
            column = parse_column(spec.strip())
        except ColumnError as error:
            problems.append(str(error))
            continue
        if column in columns:
            continue
        if len(columns) == MAX_COLUMNS:
            problems.append(f"at most {MAX_COLUMNS} columns: {spec!r} left out")
            continue
        columns.append(column)
    return columns, problems


def with_columns(runs: QuerySet[Run], columns: list[Column]) -> QuerySet[Run]:
    """`runs` annotated with each metric column's last value (two index probes a run,
    as `latest_success`)."""
    for column in columns:
        if column.kind == METRIC:
            key = MetricKey.objects.filter(run=OuterRef(OuterRef("pk")), name=column.key)
            points = MetricPoint.objects.filter(key=Subquery(key.values("pk")[:1]))
            last = points.order_by("-step", "-pk").values("value")[:1]
            runs = runs.annotate(**{column.field: Subquery(last)})
    return runs


def sorted_by(runs: QuerySet[Run], column: Column, descending: bool) -> QuerySet[Run]:
    """Sorted by the column, runs without a value last either way; ties newest first.
    A config value sorts as the database orders JSON: numbers by value."""
    if column.kind == METRIC:
        expression = F(column.field)
    else:
        expression = F("config")
        for part in column.key.split("."):
            expression = KeyTransform(part, expression)
    order = expression.desc(nulls_last=True) if descending else expression.asc(nulls_last=True)
    return runs.order_by(order, "-pk")


def shown(value: Any) -> str:
    """A cell's text: numbers to 4 significant digits, lists and mappings compact,
    passwords in addresses redacted; "—" for no value."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict | list):
        value = json.dumps(value, separators=(",", ":"))
    return redact_urls_in(str(value))


def offered_keys(runs_shown: list[Run]) -> list[str]:
    """What the column picker suggests: the config keys (leaves) of the runs shown, then
    every metric name logged."""
    leaves = dict.fromkeys(key for run in runs_shown for key in _leaf_keys(run.config))
    keys = [f"{CONFIG}:{key}" for key in leaves]
    names = MetricKey.objects.order_by().values_list("name", flat=True).distinct()
    keys += [f"{METRIC}:{name}" for name in sorted(names[:MAX_OFFERED])]
    return keys[: 2 * MAX_OFFERED]


def _leaf_keys(node: Any, prefix: str = "") -> list[str]:
    if not isinstance(node, dict):
        return [prefix] if prefix else []
    keys: list[str] = []
    for name, child in node.items():
        if isinstance(name, str) and CONFIG_KEY.fullmatch(name):
            keys += _leaf_keys(child, f"{prefix}.{name}" if prefix else name)
    return keys


@dataclass
class ChosenColumns:
    """What a runs-list query asks for: its columns (`col`, repeated), the one it sorts
    by (`sort`: a chosen column's spec, `-` first for descending) and what was wrong."""

    columns: list[Column]
    sort: Column | None
    descending: bool
    problems: list[str]

    @classmethod
    def from_query(cls, query: QueryDict) -> ChosenColumns:
        columns, problems = chosen_columns(query.getlist("col"))
        # An ordering picked in the list's Sort menu comes after a column's sort.
        wanted = "" if query.get("ordering") else query.get("sort", "")
        descending = wanted.startswith("-")
        sort = None
        if wanted:
            try:
                sort = parse_column(wanted.removeprefix("-"))
            except ColumnError as error:
                problems.append(f"sort: {error}")
            else:
                if sort not in columns:
                    problems.append(f"sort: {sort.spec!r} is not a shown column; add it first")
                    sort = None
        return cls(columns, sort, descending, problems)

    def applied(self, runs: QuerySet[Run]) -> QuerySet[Run]:
        runs = with_columns(runs, self.columns)
        return sorted_by(runs, self.sort, self.descending) if self.sort else runs

    def headers(self, query: QueryDict) -> list[dict[str, Any]]:
        """Each column's header: its key, the link that sorts by it (descending first,
        then the other way), the link that drops it, and how it sorts now."""
        headers = []
        for column in self.columns:
            now = None
            if column == self.sort:
                now = "descending" if self.descending else "ascending"
            flip = column.spec if now == "descending" else f"-{column.spec}"
            kept = [spec for spec in query.getlist("col") if spec.strip() != column.spec]
            dropped_sort = query.get("sort", "").removeprefix("-") == column.spec
            headers.append(
                {
                    "column": column,
                    "sorted": now,
                    "sort_query": _with(query, sort=flip, ordering=None),
                    "drop_query": _with(query, col=kept, sort=None if dropped_sort else ...),
                }
            )
        return headers

    def cells(self, run: Run) -> list[str]:
        return [shown(column.value(run)) for column in self.columns]


def _with(query: QueryDict, **changes: Any) -> str:
    """`query` as a query string with `changes` (a list: the values of a repeated
    parameter; None: the parameter dropped; ...: left as it is), from the first page."""
    changed = query.copy()
    changed.pop("page", None)
    for name, value in changes.items():
        if value is ...:
            continue
        changed.pop(name, None)
        if isinstance(value, list):
            changed.setlist(name, value)
        elif value is not None:
            changed[name] = value
    return changed.urlencode()
