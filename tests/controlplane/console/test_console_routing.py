"""Where an operator's command goes: to the run's trainer link in this web process
directly (tests/controlplane/console/test_console_safety.py), else through the run's
trainer group on the channel layer, to the process that holds the link; named by the
session's user whatever the browser claims, and stamped only by the process that
writes it to the link."""

import json
import time

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client

from controlplane.console.stamps import CLOCK_NAME, stamped_command
from controlplane.realtime.groups import trainer_group
from controlplane.realtime.routing import websocket_application
from tests.runs import submitted_run

pytestmark = pytest.mark.django_db(transaction=True)


def operator_cookie(name: str) -> str:
    user = get_user_model().objects.create_user(name, password="pw-for-tests")
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}"


def console_socket(run_id: int, cookie: str) -> WebsocketCommunicator:
    """A browser's console socket through the project's ASGI application (its session
    and origin checks included)."""
    return WebsocketCommunicator(
        websocket_application, f"/ws/console/{run_id}/",
        headers=[(b"origin", b"http://localhost"), (b"cookie", cookie.encode())],
    )  # fmt: skip


async def test_a_command_for_a_link_in_another_process_goes_through_the_trainer_group():
    run = await sync_to_async(submitted_run)("routing")
    cookie = await sync_to_async(operator_cookie)("olga")
    layer = get_channel_layer()
    elsewhere = await layer.new_channel()  # the link's consumer in another web process
    await layer.group_add(trainer_group(run.pk), elsewhere)

    console = console_socket(run.pk, cookie)
    connected, _ = await console.connect()
    assert connected
    await console.send_to(text_data=json.dumps(
        {"op": "command", "robot": 1, "action": [0.5] * 7, "id": "c1", "operator": "mallory",
         "sent_at": 1e12, "clock": "forged"}
    ))  # fmt: skip
    event = await layer.receive(elsewhere)
    message = event["message"]
    assert event["type"] == "teleop.command"
    assert (message["op"], message["robot"], message["id"]) == ("command", 1, "c1")
    assert message["operator"] == "olga"  # the session's user, not what the browser said
    # Not stamped yet: the browser's claim is dropped, and this process's clock is not
    # the one of the process that will write the command to the link.
    assert message["sent_at"] is None and message["clock"] is None
    await console.send_to(text_data=json.dumps({"op": "take_over", "robot": 1}))
    assert (await layer.receive(elsewhere))["message"]["op"] == "take_over"

    await console.disconnect()  # it had taken a robot over: its operator's link is lost
    event = await layer.receive(elsewhere)
    assert event["message"]["op"] == "link_lost" and event["message"]["operator"] == "olga"


def test_the_process_holding_the_link_stamps_the_command_with_its_monotonic_clock():
    before = time.monotonic()
    text = stamped_command({"type": "teleop", "op": "command", "sent_at": None})
    stamped = json.loads(text)
    assert before <= stamped["sent_at"] <= time.monotonic()
    assert stamped["clock"] == CLOCK_NAME
