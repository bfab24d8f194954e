"""Reading runs: the runs list's rows (the figures each shows) for the page and the API
alike. A run's job log: runs/run_logs.py."""

from __future__ import annotations

from django.db.models import DurationField, ExpressionWrapper, F, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce, Now

from controlplane.runs.models import MetricKey, MetricPoint, Run
from controlplane.runs.series import OVERALL_SUCCESS_KEY


def listed_runs() -> QuerySet[Run]:
    """Every run as the runs list shows it, each annotated with `latest_success` (the
    last `rollout/success_rate` point) and `duration` (until now while running): one
    query per page whatever the number of runs. Filters and orderings: run_filters.py."""
    return with_figures(Run.objects.select_related("experiment", "revision", "created_by"))


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
