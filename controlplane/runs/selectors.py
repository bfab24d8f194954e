"""Reading runs: the runs list (filters, sort, the figures each row shows) for the page
and the API alike, and what Ray holds about a run."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from django.db import connection
from django.db.models import DurationField, ExpressionWrapper, F, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce, Now

from controlplane.runs import ray_jobs
from controlplane.runs.models import MetricKey, MetricPoint, Run, RunKind, RunState
from controlplane.runs.series import OVERALL_SUCCESS_KEY

ORDERINGS = ("created", "-created", "success", "-success", "duration", "-duration")
_ORDER_FIELDS = {"created": "created_at", "success": "latest_success", "duration": "duration"}


class RunFilterError(ValueError):
    """A runs-list parameter with a value it cannot take: {parameter: message}."""

    def __init__(self, problems: dict[str, str]):
        super().__init__("; ".join(f"{k}: {v}" for k, v in problems.items()))
        self.problems = problems


@dataclass(frozen=True)
class RunFilters:
    state: str = ""
    experiment: str = ""
    tag: str = ""
    creator: str = ""
    kind: str = ""
    ordering: str = "-created"

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> RunFilters:
        """Read the filters from query parameters; RunFilterError names every bad one."""
        found = cls(
            state=params.get("state", "").strip(),
            experiment=params.get("experiment", "").strip(),
            tag=params.get("tag", "").strip(),
            # `user` is what the runs page called it before the API named it `creator`.
            creator=(params.get("creator") or params.get("user") or "").strip(),
            kind=params.get("kind", "").strip(),
            ordering=params.get("ordering", "").strip() or "-created",
        )
        problems = {}
        if found.state and found.state not in RunState.values:
            problems["state"] = f"Unknown state {found.state!r}; use one of {RunState.values}."
        if found.kind and found.kind not in RunKind.values:
            problems["kind"] = f"Unknown kind {found.kind!r}; use one of {RunKind.values}."
        if found.ordering not in ORDERINGS:
            problems["ordering"] = f"Unknown ordering {found.ordering!r}; use one of {ORDERINGS}."
        if problems:
            raise RunFilterError(problems)
        return found


def runs_list(filters: RunFilters) -> QuerySet[Run]:
    """The runs matching `filters`, sorted, each annotated with `latest_success` (the
    last `rollout/success_rate` point) and `duration` (until now while running): one
    query per page whatever the number of runs."""
    runs = with_figures(Run.objects.select_related("experiment", "revision", "created_by"))
    if filters.state:
        runs = runs.filter(state=filters.state)
    if filters.experiment:
        runs = runs.filter(experiment__name=filters.experiment)
    if filters.creator:
        runs = runs.filter(created_by__username=filters.creator)
    if filters.tag:
        runs = runs.filter(**_has_tag(filters.tag))
    if filters.kind:
        runs = runs.filter(kind=filters.kind)
    descending = filters.ordering.startswith("-")
    field = F(_ORDER_FIELDS[filters.ordering.lstrip("-")])
    order = field.desc(nulls_last=True) if descending else field.asc(nulls_last=True)
    return runs.order_by(order, "-pk")


def with_figures(runs: QuerySet[Run]) -> QuerySet[Run]:
    """`latest_success` and `duration` for each run, as subquery/expression annotations."""
    # The key row first, then its points by the (key, step) index backwards: two index
    # probes per run. A join of points to keys here made PostgreSQL scan the points.
    success_key = MetricKey.objects.filter(
        run=OuterRef(OuterRef("pk")), name=OVERALL_SUCCESS_KEY
    ).values("pk")[:1]
    last_success = MetricPoint.objects.filter(key=Subquery(success_key)).order_by("-step", "-pk")
    return runs.annotate(
        latest_success=Subquery(last_success.values("value")[:1]),
        duration=ExpressionWrapper(
            Coalesce("finished_at", Now()) - F("started_at"), output_field=DurationField()
        ),
    )


def _has_tag(tag: str) -> dict:
    if connection.features.supports_json_field_contains:
        return {"tags__contains": [tag]}
    # SQLite: the JSON text holds the tag quoted as a whole element.
    return {"tags__icontains": json.dumps(tag)}


def job_logs(run: Run) -> str:
    """The current attempt's job log ("" before it has a job). Raises RayJobsError."""
    return ray_jobs.logs(run.submission_id) if run.ray_job_id else ""
