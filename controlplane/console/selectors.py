"""What the console pages show: the robots online, and the audit of takeovers."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db.models import QuerySet

from controlplane.console import live
from controlplane.inventory.models import Robot
from controlplane.inventory.selectors import robots as inventory_robots
from controlplane.runs.models import ACTIVE_STATES, Run, RunEvent


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
    run: Run
    operator: str
    robot: str
    started: datetime
    ended: datetime
    steps: int
    reason: str

    @property
    def seconds(self) -> float:
        return (self.ended - self.started).total_seconds()


def takeovers(limit: int = 500) -> list[TakeoverRow]:
    """The latest takeovers, newest first (each a run's stored `takeover` event)."""
    events: QuerySet[RunEvent] = (
        RunEvent.objects.filter(kind="takeover").select_related("run__experiment")
        .order_by("-created_at", "-pk")[:limit]
    )  # fmt: skip
    return [
        TakeoverRow(
            run=event.run,
            operator=event.data["operator"],
            robot=event.data["robot_name"],
            started=_when(event.data["started"]),
            ended=_when(event.data["ended"]),
            steps=event.data["steps"],
            reason=event.data["reason"],
        )  # fmt: skip
        for event in events
    ]


def _when(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)
