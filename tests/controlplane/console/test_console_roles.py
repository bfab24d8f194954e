"""An operator who loses the right to drive stops driving at their next command: removed
from the operator group, deactivated or logged out elsewhere, their console socket on a
live daphne lets go of the robot they hold and is closed with the documented code, and
the command never reaches the run's trainer link."""

from __future__ import annotations

import time

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client

from controlplane.access.sockets import (
    CLOSE_FORBIDDEN,
    CLOSE_UNAUTHENTICATED,
    NO_LONGER_LOGGED_IN,
)
from controlplane.console.consumers import NO_LONGER_OPERATOR, VIEW_OPS_BURST, VIEW_OPS_PER_S
from tests.controlplane.console.scene import PUSH, Console, Robots, cookie_of, logged_in
from tests.processes import wait_until
from tests.runs import submitted_run
from trainer.envs.teleop import TeleopSettings

pytestmark = pytest.mark.django_db(transaction=True)


def remove_from_the_operator_group(user, client: Client) -> None:
    user.groups.remove(Group.objects.get(name="operator"))


def deactivate(user, client: Client) -> None:
    user.is_active = False
    user.save()


def log_out_in_another_request(user, client: Client) -> None:
    assert client.post("/logout/").status_code in (200, 302)


@pytest.mark.parametrize(
    "lose_the_right, code, reason",
    [
        (remove_from_the_operator_group, CLOSE_FORBIDDEN, NO_LONGER_OPERATOR),
        (deactivate, CLOSE_UNAUTHENTICATED, NO_LONGER_LOGGED_IN),
        (log_out_in_another_request, CLOSE_UNAUTHENTICATED, NO_LONGER_LOGGED_IN),
    ],
)
def test_an_operator_who_may_no_longer_drive_is_cut_off_at_the_next_command(
    web, lose_the_right, code, reason
):
    run = submitted_run("roles")
    client = logged_in("olga", "operator")
    # A long deadman: only the lost right may end this takeover, even on a busy machine.
    robots = Robots(web.url, run.pk, TeleopSettings(deadman_s=5.0))
    olga = Console(web.url, run.pk, cookie_of(client), "olga")
    try:
        olga.wait_for(lambda m: m.get("type") == "console", "the robots' state")
        olga.take_over(0)
        olga.send(op="command", robot=0, action=PUSH, id="before")
        wait_until(lambda: robots.got(id="before"), 10, "the first command at the robot", 0.01)

        lose_the_right(get_user_model().objects.get(username="olga"), client)
        olga.send(op="command", robot=0, action=PUSH, id="after")

        wait_until(olga.closed.is_set, 10, "the socket closed", 0.01)
        assert olga.close_code == code
        last = olga.received[-1]  # why, for a server that passes no close reason on
        # The command's own check, or the socket's timer if it came first.
        assert last["op"] in ("command", "recheck")
        assert last == {"type": "refused", "status": code - 4000, "op": last["op"],
                        "error": reason, "close": code}  # fmt: skip
        wait_until(lambda: robots.source.mode(0)[0] == "policy", 10, "the release", 0.01)
        assert robots.source.takeovers[-1].reason == "operator link lost"
        assert robots.got(op="link_lost", operator="olga")
        time.sleep(0.3)  # anything still on its way would have arrived
        assert not robots.got(id="after"), "the refused command reached the trainer"
        assert not robots.got(op="command", operator="olga")[1:]  # only "before" did
    finally:
        olga.close()
        robots.close()


def test_a_demoted_operators_page_reconnects_as_a_viewer(web):
    run = submitted_run("roles")
    client = logged_in("olga", "operator")
    robots = Robots(web.url, run.pk, TeleopSettings(deadman_s=5.0))
    olga = Console(web.url, run.pk, cookie_of(client), "olga")
    again = None
    try:
        olga.wait_for(lambda m: m.get("type") == "console", "the robots' state")
        olga.take_over(0)
        remove_from_the_operator_group(get_user_model().objects.get(username="olga"), client)
        olga.send(op="watch", robot=0)  # any message (but ping) re-checks
        wait_until(olga.closed.is_set, 10, "the socket closed", 0.01)
        assert olga.close_code == CLOSE_FORBIDDEN
        wait_until(lambda: robots.source.mode(0)[0] == "policy", 10, "the release", 0.01)

        again = Console(web.url, run.pk, cookie_of(client), "olga")  # what the page does
        again.send(op="watch", robot=1)  # watching is still hers
        again.wait_for(lambda m: m.get("type") == "console", "the robots' state")
        again.send(op="take_over", robot=0)
        refused = again.wait_for(lambda m: m.get("type") == "refused", "the refusal")
        assert refused["status"] == 403 and "you are viewer" in refused["error"]
        assert not again.closed.is_set()
        assert len(robots.got(op="take_over", operator="olga")) == 1
    finally:
        for thing in (again, olga, robots):
            if thing is not None:
                thing.close()


def test_a_viewer_flooding_watch_messages_is_held_to_a_few_a_second(web):
    """What a viewer may send goes down the run's link ahead of the operators' commands:
    a flood of it is answered with an error and goes no further."""
    run = submitted_run("flood")
    robots = Robots(web.url, run.pk, TeleopSettings(deadman_s=5.0))
    vera = Console(web.url, run.pk, cookie_of(logged_in("vera", "viewer")), "vera")
    try:
        vera.wait_for(lambda m: m.get("type") == "console", "the robots' state")
        started = time.monotonic()
        for _ in range(200):
            vera.send(op="watch", robot=0)
        vera.wait_for(lambda m: "too many watch messages" in m.get("error", ""), "the refusal")
        wait_until(lambda: len(robots.got(op="watch", operator="vera")) >= VIEW_OPS_BURST, 10,
                   "the allowed watches at the robots", 0.01)  # fmt: skip
        time.sleep(0.5)  # any more would have arrived by now
        allowed = VIEW_OPS_BURST + VIEW_OPS_PER_S * (time.monotonic() - started) + 1
        assert len(robots.got(op="watch", operator="vera")) <= allowed
        assert not vera.closed.is_set()  # held back, not cut off
    finally:
        vera.close()
        robots.close()
