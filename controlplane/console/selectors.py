"""What the console pages show: the robots online, and the audit of takeovers and
e-stops."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db.models import QuerySet

from controlplane.console import live
from controlplane.inventory.models import Robot
from controlplane.inventory.selectors import robots as inventory_robots
from controlplane.runs.models import ACTIVE_STATES, Run, RunEvent
from trainer.link.protocol import MAX_WALL_TIME


@dataclass
class OnlineRobot:
    run: Run
    robot: dict[str, Any]  # trainer.link.console_messages.RobotState
    task: str


def robots_online() -> list[OnlineRobot]:
    """Every robot of an active run whose trainer reported to the console lately."""
    runs = {run.pk: run for run in Run.objects.filter(state__in=ACTIVE_STATES)
            .select_related("experiment")}  # fmt: skip
    online = live.online(list(runs))
    return [
        OnlineRobot(runs[run_id], robot, report["task"])
        for run_id, report in sorted(online.items())
        for robot in report["robots"]
    ]


def inventory_robots_with_status() -> list[tuple[Robot, OnlineRobot | None]]:
    """The inventory's robots, each with the run driving it now (matched by name)."""
    by_name = {online.robot["name"]: online for online in robots_online()}
    return [(robot, by_name.get(robot.name)) for robot in inventory_robots()]


@dataclass
class TakeoverRow:
    """One takeover as the audit shows it. A field the stored event does not hold in a
    readable form (an event stored before the link protocol bounded it) is None, and
    the page says so in its place."""

    run: Run
    operator: str | None
    robot: str | None
    started: datetime | None
    ended: datetime | None
    steps: int | None
    reason: str | None

    @property
    def seconds(self) -> float | None:
        if self.started is None or self.ended is None:
            return None
        return (self.ended - self.started).total_seconds()


def takeovers(limit: int = 500) -> list[TakeoverRow]:
    """The latest takeovers, newest first (each a run's stored `takeover` event)."""
    events: QuerySet[RunEvent] = (
        RunEvent.objects.filter(kind="takeover").select_related("run__experiment")
        .order_by("-created_at", "-pk")[:limit]
    )  # fmt: skip
    return [_takeover_row(event) for event in events]


def _takeover_row(event: RunEvent) -> TakeoverRow:
    data = event.data if isinstance(event.data, dict) else {}
    steps = data.get("steps")
    return TakeoverRow(
        run=event.run,
        operator=_text(data.get("operator")),
        robot=_text(data.get("robot_name")),
        started=_when(data.get("started")),
        ended=_when(data.get("ended")),
        steps=steps if type(steps) is int else None,
        reason=_text(data.get("reason")),
    )


@dataclass
class StopRow:
    """An e-stop pressed or cleared, as the audit shows it (None: not readable)."""

    run: Run
    action: str | None
    operator: str | None
    robot: str | None
    at: datetime | None
    stopped_by: str | None
    override: bool


def estops(limit: int = 500) -> list[StopRow]:
    """The latest e-stops pressed and cleared, newest first (each a run's stored
    `estop` event)."""
    events: QuerySet[RunEvent] = (
        RunEvent.objects.filter(kind="estop").select_related("run__experiment")
        .order_by("-created_at", "-pk")[:limit]
    )  # fmt: skip
    rows = []
    for event in events:
        data = event.data if isinstance(event.data, dict) else {}
        rows.append(StopRow(
            run=event.run, action=_text(data.get("action")), operator=_text(data.get("operator")),
            robot=_text(data.get("robot_name")), at=_when(data.get("at")),
            stopped_by=_text(data.get("stopped_by")), override=data.get("override") is True,
        ))  # fmt: skip
    return rows


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _when(seconds: Any) -> datetime | None:
    """The time of Unix `seconds` as the link protocol bounds it (0..MAX_WALL_TIME);
    None for anything else (a date no page can show, or not a number)."""
    if type(seconds) not in (int, float) or not math.isfinite(seconds):
        return None
    if not 0 <= seconds <= MAX_WALL_TIME:
        return None
    return datetime.fromtimestamp(seconds, tz=UTC)
