"""Metric gates: `METRIC OP NUMBER` checked against a run's final metrics (its summary).

`METRIC` is a key of the summary (`rollout/success_rate`) or a short name without a
slash (`success_rate`) that stands for the one key ending in `/success_rate`; when
several keys end so, `rollout/<name>` wins, else the gate is ambiguous and fails.
"""

import math
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

OPERATORS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    "<": operator.lt,
}
# Two-character operators first, so ">=" is not read as ">" followed by "=…".
_GATE = re.compile(
    r"^\s*(?P<metric>[A-Za-z0-9_.\-/]+)\s*(?P<op>>=|<=|==|!=|>|<)\s*(?P<value>\S+)\s*$"
)


class GateSyntaxError(ValueError):
    pass


@dataclass(frozen=True)
class Gate:
    expression: str
    metric: str
    op: str
    threshold: float


@dataclass(frozen=True)
class GateResult:
    gate: Gate
    passed: bool
    metric_key: str | None  # the summary key the metric resolved to
    value: float | None
    message: str

    def to_dict(self) -> dict[str, object]:
        return {
            "expression": self.gate.expression,
            "metric": self.gate.metric,
            "metric_key": self.metric_key,
            "op": self.gate.op,
            "threshold": self.gate.threshold,
            "value": self.value,
            "passed": self.passed,
            "message": self.message,
        }


def parse_gate(expression: str) -> Gate:
    match = _GATE.match(expression)
    if not match:
        raise GateSyntaxError(
            f"bad gate {expression!r}: expected METRIC OP NUMBER, e.g. 'success_rate>=0.8' "
            f"(OP one of {', '.join(OPERATORS)})"
        )
    try:
        threshold = float(match["value"])
    except ValueError:
        raise GateSyntaxError(
            f"bad gate {expression!r}: {match['value']!r} is not a number"
        ) from None
    if not math.isfinite(threshold):
        raise GateSyntaxError(f"bad gate {expression!r}: the threshold must be finite")
    return Gate(expression.strip(), match["metric"], match["op"], threshold)


def resolve_metric(metric: str, summary: Mapping[str, object]) -> tuple[str | None, str]:
    """(the summary key `metric` names, or None with the reason)."""
    if metric in summary:
        return metric, ""
    if "/" not in metric:
        candidates = sorted(key for key in summary if key.endswith(f"/{metric}"))
        if len(candidates) == 1:
            return candidates[0], ""
        if f"rollout/{metric}" in candidates:
            return f"rollout/{metric}", ""
        if candidates:
            return None, f"{metric!r} is ambiguous: {', '.join(candidates)}"
    known = ", ".join(sorted(summary)) or "none"
    return None, f"{metric!r} is not among the run's final metrics (known: {known})"


def evaluate(gate: Gate, summary: Mapping[str, object]) -> GateResult:
    key, reason = resolve_metric(gate.metric, summary)
    if key is None:
        return GateResult(gate, False, None, None, reason)
    raw = summary[key]
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        return GateResult(gate, False, key, None, f"{key} is not a number: {raw!r}")
    value = float(raw)
    if math.isnan(value):
        return GateResult(gate, False, key, value, f"{key} is NaN")
    passed = OPERATORS[gate.op](value, gate.threshold)
    verdict = "passed" if passed else "FAILED"
    return GateResult(
        gate, passed, key, value, f"{key} = {value:g} {gate.op} {gate.threshold:g}: {verdict}"
    )
