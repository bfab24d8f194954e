"""The takeover audit (/console/audit/) shows every stored takeover, and never fails on
one it cannot read: events stored before the link protocol bounded their numbers (a
start in the year 3e10, a time that is not a number) show a placeholder in place."""

import pytest
from django.contrib.auth import get_user_model

from controlplane.runs.models import RunEvent
from tests.runs import submitted_run

pytestmark = pytest.mark.django_db


def takeover(**changes) -> dict:
    return {"operator": "olga", "robot": 0, "robot_name": "sim-0", "started": 1.7e9,
            "ended": 1.7e9 + 12.5, "steps": 40, "reason": "released", **changes}  # fmt: skip


def test_a_takeover_the_page_cannot_read_shows_a_placeholder_not_a_500(client):
    run = submitted_run("audited")
    stored = [
        takeover(),
        takeover(operator="ivan", started=1e18),  # past any date a page can show
        takeover(operator="vera", ended="soon", steps="many"),
        takeover(operator="ada", started=-1e300),
        {"operator": ["not", "text"]},  # a shape of its own
    ]
    for data in stored:
        RunEvent.objects.create(run=run, kind="takeover", data=data)
    RunEvent.objects.create(run=run, kind="takeover", data=["not", "an", "object"])
    client.force_login(get_user_model().objects.create_user("viewer"))
    response = client.get("/console/audit/")
    assert response.status_code == 200
    page = response.content.decode()
    takeovers, estops = page.split('id="estops"')
    rows = takeovers.split("<tr>")[2:]  # after the header row
    assert len(rows) == 6
    readable = next(row for row in rows if "olga" in row)
    assert "2023-11-14 22:13:20" in readable and "12.5" in readable and "unreadable" not in readable
    for name in ("ivan", "vera", "ada"):
        assert "unreadable" in next(row for row in rows if name in row)
    assert sum("unreadable" in row for row in rows) == 5
    assert "No e-stop yet." in estops


def test_e_stops_are_listed_and_one_the_page_cannot_read_shows_a_placeholder(client):
    run = submitted_run("stopped")
    at = 1.7e9
    for data in (
        {"action": "pressed", "operator": "ivan", "robot": 0, "robot_name": "sim-0", "at": at},
        {"action": "cleared", "operator": "ada", "robot": 0, "robot_name": "sim-0",
         "at": at + 5, "stopped_by": "ivan", "override": True},
        {"action": ["?"], "at": "soon"},
    ):  # fmt: skip
        RunEvent.objects.create(run=run, kind="estop", data=data)
    client.force_login(get_user_model().objects.create_user("viewer"))
    page = client.get("/console/audit/").content.decode()
    rows = page.split('id="estops"')[1].split("<tr>")[2:]
    unreadable, cleared, pressed = rows  # newest first
    assert "cleared (pressed by ivan) as admin" in cleared and "2023-11-14 22:13:25" in cleared
    assert "<td>pressed</td>" in pressed and "<td>ivan</td>" in pressed
    assert "unreadable" in unreadable
    assert not any("unreadable" in row for row in (cleared, pressed))
