"""The operator console's safety rules, end to end: operators' sockets on a live daphne,
the run's real trainer link, the console bridge and the built-in env stepped by the
intervention wrapper, as an RLPD run steps it. What the env applied is the evidence."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from django.contrib.auth import get_user_model

from controlplane.runs.models import RunEvent
from tests.controlplane.console.scene import (
    PUSH,
    Console,
    Robots,
    first_zero_action,
    keep_driving,
    login,
    take_over_and_drive,
)
from tests.processes import wait_until
from tests.runs import submitted_run
from trainer.envs.teleop import TeleopSettings

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def scene(web):
    run = submitted_run("console")
    cookies = {"olga": login("olga", "operator"), "ivan": login("ivan", "operator"),
               "vera": login("vera", None), "ada": login("ada", "admin")}  # fmt: skip
    made: list = []

    def make(settings: TeleopSettings | None = None) -> tuple[Robots, dict[str, Console]]:
        robots = Robots(web.url, run.pk, settings or TeleopSettings(deadman_s=0.15))
        consoles = {
            name: Console(web.url, run.pk, cookie, name) for name, cookie in cookies.items()
        }
        made.extend([robots, *consoles.values()])
        for console in consoles.values():  # the trainer's state reaches every console
            console.wait_for(lambda m: m.get("type") == "console", "the robots' state")
        return robots, consoles

    yield run, make
    for thing in reversed(made):
        thing.close()


def test_a_viewer_cannot_take_over(scene):
    _, make = scene
    robots, consoles = make()
    consoles["vera"].send(op="take_over", robot=0)
    refused = consoles["vera"].wait_for(lambda m: m.get("type") == "refused", "the refusal")
    assert refused["status"] == 403 and "operator role" in refused["error"]
    consoles["vera"].send(op="watch", robot=1)  # watching is for everyone
    frame = consoles["vera"].wait_for(
        lambda m: m.get("type") == "console" and any(f["robot"] == 1 for f in m["frames"]),
        "a frame of robot 1",
    )
    assert frame["frames"][0]["jpeg"].startswith("/9j/")  # a JPEG
    # Her watch reached the trainer after her take-over would have: nothing took robot 0.
    assert robots.source.mode(0) == ("policy", None)
    assert not robots.source.takeovers


def test_two_operators_one_lock_and_the_other_sees_who_holds_it(scene):
    _, make = scene
    # A long deadman: olga sends no heartbeats between her take-over and her release,
    # several round trips later (more than 0.15 s on a busy machine).
    robots, consoles = make(TeleopSettings(deadman_s=5.0))
    consoles["olga"].send(op="take_over", robot=0)
    assert consoles["olga"].reply("take_over", "olga")["ok"]
    consoles["ivan"].send(op="take_over", robot=0)
    refused = consoles["ivan"].reply("take_over", "ivan")
    assert not refused["ok"] and refused["error"] == "copy 0 is held by olga"
    state = consoles["ivan"].wait_for(
        lambda m: m.get("type") == "console" and m["robots"][0]["holder"] == "olga",
        "olga holding robot 0",
    )
    assert state["robots"][0]["mode"] == "human"
    consoles["ivan"].send(op="request", robot=0)
    asked = consoles["olga"].wait_for(lambda m: m.get("type") == "request", "ivan's request")
    assert asked == {"type": "request", "robot": 0, "by": "ivan"}
    consoles["olga"].send(op="release", robot=0)
    assert consoles["olga"].reply("release", "olga")["ok"]
    consoles["ivan"].send(op="take_over", robot=0)
    assert consoles["ivan"].reply("take_over", "ivan")["ok"]
    assert robots.source.mode(0) == ("human", "ivan")


# How soon a lost operator's robot gets its zero action, in milliseconds, is
# bench/teleop.py's `teleop_deadman` (target 200 ms): on a loaded test machine the robot's
# thread can miss its steps for longer than that. The tests below check what the robot
# applies from the operator's last command on: their command, then a zero action, and
# only then the policy.


def _pushed_then_zero(robots: Robots, since: float) -> float:
    """When robot 0 applied its first zero action after `since`, having applied nothing
    but the operator's command (`PUSH`, in its window) between the two."""
    zero = first_zero_action(robots, since)
    between = [a for t, a, _ in robots.after(since) if t < zero]
    assert all(bool(a[0].eq(torch.tensor(PUSH)).all()) for a in between), between
    return zero


def test_closing_the_operators_socket_releases_with_a_zero_action(scene):
    run, make = scene
    # A long deadman: only the closed socket may end this takeover, even on a busy machine.
    robots, consoles = make(TeleopSettings(deadman_s=10.0))
    olga = consoles["olga"]
    olga.take_over(0)
    stop = threading.Event()
    keep_driving(olga, stop)
    wait_until(lambda: any(bool(a[0].eq(torch.tensor(PUSH)).all()) for _, a, _ in robots.steps),
               10, "olga's command applied", 0.01)  # fmt: skip
    stop.set()
    assert robots.source.mode(0) == ("human", "olga")
    closed_at = time.time()
    olga.close()
    zero = _pushed_then_zero(robots, since=closed_at)
    wait_until(lambda: robots.source.mode(0)[0] == "policy", 9, "the release", 0.005)
    (takeover,) = robots.source.takeovers
    assert takeover.reason == "operator link lost"
    # After the zero action the policy drives again.
    wait_until(lambda: any(not i[0] for _, _, i in robots.after(zero)), 5, "the policy", 0.01)


def test_missed_heartbeats_release_with_a_zero_action(scene):
    _, make = scene
    robots, consoles = make()
    olga = consoles["olga"]
    stop = take_over_and_drive(olga, robots)
    pushed = torch.tensor(PUSH)
    stop.set()  # the socket stays open, but nothing more arrives (a frozen tab)
    wait_until(lambda: robots.source.mode(0)[0] == "policy", 5, "the deadman", 0.005)
    assert robots.source.takeovers[-1].reason == "heartbeat lost"
    # Silence as the robot met it: from its last step of the operator's command (on a
    # loaded machine commands arrive late, or far enough apart for the deadman to fire
    # while the page still sends). Zero actions start once the last command is older
    # than its window (0.1 s); the deadman (0.15 s) then gives the robot back: the
    # robot's very next step is a zero action.
    silent_from = max(t for t, a, _ in robots.steps if bool(a[0].eq(pushed).all()))
    zero = _pushed_then_zero(robots, since=silent_from)
    assert robots.after(silent_from)[0][0] == zero


def test_a_command_older_than_its_window_is_never_applied(scene):
    _, make = scene
    robots, consoles = make(TeleopSettings(deadman_s=5.0, command_window_s=0.1))
    olga = consoles["olga"]
    olga.take_over(0)
    robots.paused.set()  # the env is busy: the command waits
    olga.send(op="command", robot=0, action=PUSH)
    sent = time.time()
    time.sleep(0.3)  # the scenario itself: the command ages past its window while it waits
    robots.paused.clear()
    wait_until(lambda: len(robots.after(sent + 0.3)) >= 3, 5, "steps after the pause", 0.01)
    for _, actions, intervened in robots.after(sent + 0.3)[:3]:
        assert bool(intervened[0]) and bool(actions[0].eq(0).all())  # held, not pushed


def test_e_stop_holds_the_robot_until_cleared(scene):
    _, make = scene
    robots, consoles = make()
    olga, ivan = consoles["olga"], consoles["ivan"]
    ivan.send(op="estop", robot=1)
    assert ivan.reply("estop", "ivan")["ok"]
    stopped_at = time.time()
    wait_until(lambda: len(robots.after(stopped_at + 0.05)) >= 10, 10, "steps", 0.01)
    held = robots.after(stopped_at + 0.05)
    assert all(bool(i[1]) and bool(a[1].eq(0).all()) for _, a, i in held)
    olga.send(op="take_over", robot=1)
    refused = olga.reply("take_over", "olga")
    assert not refused["ok"] and "e-stopped by ivan" in refused["error"]
    # Another operator cannot clear it, even claiming to be an admin ...
    olga.send(op="clear_stop", robot=1, override=True)
    refused = olga.reply("clear_stop", "olga")
    assert not refused["ok"] and "e-stopped by ivan: only they or an admin" in refused["error"]
    assert robots.source.mode(1) == ("e-stopped", "ivan")
    # ... who pressed it can.
    ivan.send(op="clear_stop", robot=1)
    assert ivan.reply("clear_stop", "ivan")["ok"]
    cleared_at = time.time()
    wait_until(lambda: len(robots.after(cleared_at + 0.05)) >= 3, 5, "steps", 0.01)
    assert all(not bool(i[1]) for _, _, i in robots.after(cleared_at + 0.05))


def test_an_admin_clears_another_operators_e_stop_and_the_audit_says_so(scene, client):
    run, make = scene
    robots, consoles = make()
    ivan, ada = consoles["ivan"], consoles["ada"]
    ivan.send(op="estop", robot=0)
    assert ivan.reply("estop", "ivan")["ok"]
    ada.send(op="clear_stop", robot=0)
    assert ada.reply("clear_stop", "ada")["ok"]
    assert robots.source.mode(0) == ("policy", None)
    wait_until(lambda: RunEvent.objects.filter(run=run, kind="estop").count() == 2, 10,
               "the e-stop's two audit events", 0.05)  # fmt: skip
    stored = [e.data for e in RunEvent.objects.filter(run=run, kind="estop").order_by("pk")]
    assert [(d["action"], d["operator"], d["stopped_by"], d["override"]) for d in stored] == [
        ("pressed", "ivan", None, False), ("cleared", "ada", "ivan", True),
    ]  # fmt: skip
    client.force_login(get_user_model().objects.get(username="ada"))
    audit = client.get("/console/audit/").content.decode()
    assert "cleared (pressed by ivan) as admin" in audit


def test_a_marked_success_ends_the_episode_and_the_takeover_is_audited(scene, client):
    run, make = scene
    # A long deadman: olga sends no heartbeats between her take-over and her release,
    # which on a busy machine can lie more than the default 0.15 s apart.
    robots, consoles = make(TeleopSettings(deadman_s=30))
    olga = consoles["olga"]
    olga.take_over(0)
    marked_at = time.time()
    olga.send(op="mark", robot=0, success=True)
    assert olga.reply("mark", "olga")["ok"]
    # The held robot gets no command, so it stands still: only the mark can end its
    # episode as a success (terminal).
    wait_until(
        lambda: any(t > marked_at and bool(ended[0]) and bool(won[0])
                    for t, ended, won in list(robots.ends)),
        10, "the episode marked a success", 0.01,
    )  # fmt: skip
    olga.send(op="release", robot=0)
    assert olga.reply("release", "olga")["ok"]
    event = wait_until_event(run, "takeover")
    assert event.data["reason"] == "released" and event.data["robot_name"] == "sim-0"
    client.force_login(get_user_model().objects.get(username="vera"))
    audit = client.get("/console/audit/").content.decode()
    assert "olga" in audit and "sim-0" in audit and "released" in audit


def test_bad_console_messages_get_an_error_naming_what_is_wrong(scene):
    _, make = scene
    _, consoles = make()
    olga = consoles["olga"]
    olga.send(op="command", robot=0, action=["left"])
    error = olga.wait_for(lambda m: m.get("type") == "error", "the error")
    assert "action" in error["error"]
    olga.socket.send("not json")
    olga.wait_for(lambda m: m.get("error") == 'send JSON objects with an "op"', "the error")
    olga.send(op="take_over", robot=7)
    assert "there is no robot 7" in olga.reply("take_over", "olga")["error"]


def wait_until_event(run, kind: str) -> RunEvent:
    wait_until(lambda: RunEvent.objects.filter(run=run, kind=kind).exists(), 10, kind, 0.05)
    return RunEvent.objects.filter(run=run, kind=kind).latest("pk")


def test_safety_holds_are_not_demonstrations_and_an_operators_commands_are(scene):
    # HIL-SERL's rule: a step is a human's only while the operator gives input.
    _, make = scene
    robots, consoles = make(TeleopSettings(deadman_s=0.5, command_window_s=0.1))
    olga, ivan = consoles["olga"], consoles["ivan"]
    ivan.send(op="estop", robot=1)  # robot 1: e-stopped, held still
    assert ivan.reply("estop", "ivan")["ok"]
    olga.take_over(0)  # robot 0: held, heartbeats only (an idle operator)
    idle_from = len(robots.online)

    def held_steps() -> bool:
        # Heartbeats all along: on a loaded machine 40 steps can outlast the deadman.
        olga.send(op="heartbeat", robot=0)
        return len(robots.online) >= idle_from + 40

    wait_until(held_steps, 10, "held steps", 0.025)
    assert robots.source.mode(0) == ("human", "olga")
    assert robots.source.mode(1)[0] == "e-stopped"
    held = robots.online.ordered()
    assert bool(held["action"][idle_from:].eq(0).all())  # both robots held still
    assert len(robots.demo) == 0  # none of it is a demonstration
    # Olga drives: her commands go into both buffers, robot 1 stays out of the demos.
    stop = threading.Event()
    keep_driving(olga, stop)
    wait_until(lambda: len(robots.demo) >= 10, 40, "olga's steps in the demo buffer", 0.01)
    stop.set()
    demos = robots.demo.ordered()
    assert demos["intervened"].all()
    assert all(row.tolist() == PUSH for row in demos["action"])
    online = robots.online.ordered()
    pushed = (online["action"] == torch.tensor(PUSH)).all(1)
    # Against the demos read before the online buffer: steps go on arriving meanwhile.
    assert int(pushed.sum()) >= len(demos["action"])  # every demonstration is online too
