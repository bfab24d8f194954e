"""The compare page's summary table: for each run, its success (overall and per planning
horizon) at the last iteration and at its best, its wall time and its env steps; read
in two queries whatever the number of points."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from django.db.models import Max, OuterRef, Q, Subquery

from controlplane.runs.models import MetricKey, MetricPoint, Run
from controlplane.runs.series import ENV_STEPS_KEY, OVERALL_SUCCESS_KEY

HORIZON_PREFIX = "rollout/plan_success_rate_h"
HORIZON_KEY = re.compile(re.escape(HORIZON_PREFIX) + r"(\d+)$")


@dataclass
class Figures:
    final: float | None = None
    best: float | None = None


@dataclass
class SummaryRow:
    run: Run
    success: Figures = field(default_factory=Figures)
    horizons: dict[int, Figures] = field(default_factory=dict)
    env_steps: float | None = None
    # In the table's horizon order (every run's horizons), a blank where it has none.
    horizon_columns: list[Figures] = field(default_factory=list)


@dataclass
class CompareSummary:
    horizons: list[int]
    rows: list[SummaryRow]


def compare_summary(runs: list[Run]) -> CompareSummary:
    """The runs' summary rows, in the order given; horizons: any run's, ascending."""
    last = MetricPoint.objects.filter(key=OuterRef("pk")).order_by("-step", "-pk")
    keys = (
        MetricKey.objects.filter(run__in=runs)
        .filter(
            Q(name__in=(OVERALL_SUCCESS_KEY, ENV_STEPS_KEY)) | Q(name__startswith=HORIZON_PREFIX)
        )
        .annotate(final=Subquery(last.values("value")[:1]), best=Max("metricpoint__value"))
        .values_list("run_id", "name", "final", "best")
    )
    rows = {run.pk: SummaryRow(run) for run in runs}
    horizons: set[int] = set()
    for run_id, name, final, best in keys:
        row = rows[run_id]
        if name == OVERALL_SUCCESS_KEY:
            row.success = Figures(final, best)
        elif name == ENV_STEPS_KEY:
            row.env_steps = final
        elif match := HORIZON_KEY.match(name):
            horizon = int(match.group(1))
            row.horizons[horizon] = Figures(final, best)
            horizons.add(horizon)
    ordered = sorted(horizons)
    for row in rows.values():
        row.horizon_columns = [row.horizons.get(h, Figures()) for h in ordered]
    return CompareSummary(ordered, list(rows.values()))
