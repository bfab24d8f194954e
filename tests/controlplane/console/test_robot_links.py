"""Robot links: a placed process that steps robots reaches the control plane itself, with
the attempt's run token and its name (`env-<rank>`). Through the project's ASGI
application: what such a link may send, how its robots join the run's others on the
console and the Robots page, and how an operator's command reaches every process that
may own the robot, once each, whether its link is in this web process or another."""

import asyncio
import json

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator

from controlplane.console import live
from controlplane.realtime.groups import trainer_group
from controlplane.realtime.routing import websocket_application
from controlplane.realtime.trainer_consumer import CLOSE_FORBIDDEN
from controlplane.runs.models import RunEvent
from controlplane.runs.tokens import make_run_token
from tests.controlplane.console.test_console_routing import console_socket, operator_cookie
from tests.runs import submitted_run
from trainer.link.console_messages import SOURCE_HEADER

pytestmark = pytest.mark.django_db(transaction=True)


def trainer_link(run_id: int, source: str | None = None) -> WebsocketCommunicator:
    headers = [(b"authorization", f"Bearer {make_run_token(run_id)}".encode())]
    if source is not None:
        headers.append((SOURCE_HEADER.encode(), source.encode()))
    return WebsocketCommunicator(websocket_application, f"/ws/trainer/{run_id}/", headers=headers)


def console_state(*robots: int, task: str = "reach") -> str:
    return json.dumps({
        "type": "console", "time": 1.7e9, "task": task, "control_hz": 10.0,
        "robots": [{"robot": robot, "name": f"sim-{robot}", "mode": "policy", "episode": 0,
                    "episode_step": 0, "policy_action": [0.0] * 7} for robot in robots],
    })  # fmt: skip


async def opened(socket: WebsocketCommunicator) -> WebsocketCommunicator:
    ok, code = await socket.connect()
    assert ok, code
    return socket


async def test_a_robot_link_carries_console_messages_only_and_must_name_its_process():
    run = await sync_to_async(submitted_run)("robot-link")
    robots = await opened(trainer_link(run.pk, "env-1"))
    stored = {"v": 1, "type": "event", "seq": 1, "kind": "takeover", "data": {}}
    await robots.send_to(text_data=json.dumps(stored))
    reply = json.loads(await robots.receive_from(timeout=10))
    assert reply == {"type": "error", "seq": None,
                     "error": "the robot link env-1 carries console messages only"}  # fmt: skip
    assert not await sync_to_async(RunEvent.objects.filter(run=run, kind="takeover").exists)()
    await robots.disconnect()

    for claim in ("learner", "env-", "rollout-0", "actor-", "env-1; drop", "env-12345"):
        ok, code = await trainer_link(run.pk, claim).connect()
        assert (ok, code) == (False, CLOSE_FORBIDDEN), claim
    ranks = await opened(trainer_link(run.pk, "actor-1"))  # a rank stepping its own copies
    await ranks.disconnect()


async def test_each_processs_robots_join_the_console_and_the_robots_online():
    run = await sync_to_async(submitted_run)("robot-links")
    console = await opened(console_socket(run.pk, await sync_to_async(operator_cookie)("olga")))
    learner = await opened(trainer_link(run.pk))
    worker = await opened(trainer_link(run.pk, "env-1"))
    await worker.send_to(text_data=console_state(2, 3))
    await learner.send_to(text_data=console_state(0, 1))
    seen = [json.loads(await console.receive_from(timeout=10)) for _ in range(2)]
    assert sorted((m["source"], [r["robot"] for r in m["robots"]]) for m in seen) == [
        ("env-1", [2, 3]), ("learner", [0, 1])]  # fmt: skip
    # A trainer cannot pass for another process: the link names the source.
    await worker.send_to(text_data=console_state(4)[:-1] + ', "source": "learner"}')
    assert json.loads(await console.receive_from(timeout=10))["source"] == "env-1"

    # The robots online are both processes' (each link's first state is kept at once).
    online = await sync_to_async(live.online)([run.pk])
    assert [robot["robot"] for robot in online[run.pk]["robots"]] == [0, 1, 2, 3]
    for socket in (console, learner, worker):
        await socket.disconnect()


async def test_a_command_reaches_every_link_of_the_run_once_here_or_elsewhere():
    run = await sync_to_async(submitted_run)("robot-routing")
    console = await opened(console_socket(run.pk, await sync_to_async(operator_cookie)("olga")))
    here = await opened(trainer_link(run.pk, "env-0"))
    layer = get_channel_layer()
    elsewhere = await layer.new_channel()  # env-1's link, in another web process
    await layer.group_add(trainer_group(run.pk), elsewhere)

    async def command(robot: int) -> None:
        await console.send_to(text_data=json.dumps(
            {"op": "command", "robot": robot, "action": [0.1] * 7, "id": f"c{robot}"}))  # fmt: skip

    # Before the console has heard from any process: straight to the link here, and
    # through the group for those elsewhere (not twice to the one here).
    await command(1)
    assert json.loads(await here.receive_from(timeout=10))["robot"] == 1
    assert (await asyncio.wait_for(layer.receive(elsewhere), 10))["message"]["robot"] == 1
    assert await here.receive_nothing(timeout=0.5)

    # Every process heard from has its link here: no channel-layer hop at all.
    await here.send_to(text_data=console_state(0))
    await console.receive_from(timeout=10)
    await command(0)
    assert json.loads(await here.receive_from(timeout=10))["robot"] == 0
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(layer.receive(elsewhere), timeout=0.5)

    # A process whose link is elsewhere reports robots: commands keep going both ways.
    await layer.group_send(
        f"console.{run.pk}",
        {"type": "console.state", "message": {**json.loads(console_state(1)), "source": "env-1"}},
    )
    await console.receive_from(timeout=10)
    await command(1)
    assert json.loads(await here.receive_from(timeout=10))["robot"] == 1
    assert (await asyncio.wait_for(layer.receive(elsewhere), 10))["message"]["robot"] == 1
    assert await here.receive_nothing(timeout=0.5)
    for socket in (console, here):
        await socket.disconnect()
