"""Where an operator's command goes: to the run's trainer link in this web process
directly (tests/controlplane/console/test_console_safety.py), else through the run's
trainer group on the channel layer, to the process that holds the link; named by the
session's user and stamped by the server, whatever the browser claims."""

import json
import time

import pytest
from channels.layers import get_channel_layer
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from controlplane.realtime.groups import trainer_group
from controlplane.realtime.routing import websocket_urlpatterns
from tests.runs import submitted_run

pytestmark = pytest.mark.django_db(transaction=True)


def as_user(user):
    router = URLRouter(websocket_urlpatterns)

    async def application(scope, receive, send):
        return await router({**scope, "user": user}, receive, send)

    return application


async def test_a_command_for_a_link_in_another_process_goes_through_the_trainer_group():
    from asgiref.sync import sync_to_async

    run = await sync_to_async(submitted_run)("routing")
    user = await sync_to_async(get_user_model().objects.create_user)("olga")
    group, _ = await sync_to_async(Group.objects.get_or_create)(name="operator")
    await sync_to_async(user.groups.add)(group)
    layer = get_channel_layer()
    elsewhere = await layer.new_channel()  # the link's consumer in another web process
    await layer.group_add(trainer_group(run.pk), elsewhere)

    console = WebsocketCommunicator(as_user(user), f"/ws/console/{run.pk}/")
    connected, _ = await console.connect()
    assert connected
    before = time.time()
    await console.send_to(text_data=json.dumps(
        {"op": "command", "robot": 1, "action": [0.5] * 7, "id": "c1", "operator": "mallory"}
    ))  # fmt: skip
    event = await layer.receive(elsewhere)
    message = event["message"]
    assert event["type"] == "teleop.command"
    assert (message["op"], message["robot"], message["id"]) == ("command", 1, "c1")
    assert message["operator"] == "olga"  # the session's user, not what the browser said
    assert before <= message["sent_at"] <= time.time()
    await console.send_to(text_data=json.dumps({"op": "take_over", "robot": 1}))
    assert (await layer.receive(elsewhere))["message"]["op"] == "take_over"

    await console.disconnect()  # it had taken a robot over: its operator's link is lost
    event = await layer.receive(elsewhere)
    assert event["message"]["op"] == "link_lost" and event["message"]["operator"] == "olga"
