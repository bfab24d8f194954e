"""Role versions: everything that decides a user's role or login gives them a new version
(after the transaction commits), and an open console socket pays one cache read per
message while nothing changed, one database read when something did."""

from __future__ import annotations

import asyncio
import json

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction
from django.test import Client

from controlplane.access import role_versions
from controlplane.access.sockets import CLOSE_FORBIDDEN
from controlplane.console.consumers import VIEW_OPS_BURST
from controlplane.realtime.groups import trainer_group
from tests.controlplane.console.test_console_routing import console_socket
from tests.runs import submitted_run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def olga():
    user = get_user_model().objects.create_user("olga", password="pw-for-tests")
    role_versions.seen_at_connect(user.pk)
    return user


@pytest.fixture
def operators():
    return Group.objects.get_or_create(name="operator")[0]


def changes(user, what) -> bool:
    before = role_versions.current(user.pk)
    what()
    return role_versions.current(user.pk) != before


def test_every_change_to_what_decides_a_role_gives_a_new_version(olga, operators):
    other = Group.objects.create(name="other")
    assert changes(olga, lambda: olga.groups.add(operators))
    assert changes(olga, lambda: olga.groups.remove(operators))
    assert changes(olga, lambda: olga.groups.set([operators, other]))
    assert changes(olga, lambda: olga.groups.clear())
    assert changes(olga, lambda: operators.user_set.add(olga))  # the other side
    assert changes(olga, lambda: operators.user_set.remove(olga))
    operators.user_set.add(olga)
    assert changes(olga, lambda: operators.user_set.clear())
    operators.user_set.add(olga)

    def rename() -> None:
        operators.name = "operators-old"
        operators.save()

    assert changes(olga, rename)
    assert changes(olga, lambda: operators.delete())

    client = Client()
    client.force_login(olga)
    assert changes(olga, lambda: client.post("/logout/"))

    def deactivate() -> None:
        olga.is_active = False
        olga.save()

    assert changes(olga, deactivate)

    def make_superuser() -> None:
        olga.is_superuser = True
        olga.save(update_fields=["is_superuser"])

    assert changes(olga, make_superuser)
    assert changes(olga, lambda: get_user_model().objects.filter(pk=olga.pk).delete())


def test_a_login_and_other_users_changes_leave_the_version_alone(olga, operators):
    ivan = get_user_model().objects.create_user("ivan")
    assert not changes(olga, lambda: ivan.groups.add(operators))
    assert not changes(olga, lambda: Client().force_login(olga))  # saves last_login only


def test_the_version_changes_when_the_change_is_committed_not_before(olga, operators):
    before = role_versions.current(olga.pk)
    with transaction.atomic():
        olga.groups.add(operators)
        # A socket that re-read the database now would still see the old role.
        assert role_versions.current(olga.pk) == before
    assert role_versions.current(olga.pk) != before


def test_a_missing_version_reads_as_a_change(olga):
    seen = role_versions.current(olga.pk)
    role_versions.store().delete(f"access.role-version.{olga.pk}")  # evicted
    assert role_versions.current(olga.pk) != seen
    assert role_versions.seen_at_connect(olga.pk) is not None


async def test_a_command_costs_one_cache_read_and_a_role_change_one_database_read(monkeypatch):
    """A viewer is promoted, drives, and is demoted, all on one socket: the database is
    read at connect and once per change, never for a command while nothing changed."""
    run = await sync_to_async(submitted_run)("versions")
    vera = await sync_to_async(get_user_model().objects.create_user)("vera", password="pw")
    client = Client()
    await sync_to_async(client.force_login)(vera)
    reloads = []
    reload = role_versions.logged_in_user
    monkeypatch.setattr(role_versions, "logged_in_user", lambda key: reloads.append(key) or
                        reload(key))  # fmt: skip
    layer = get_channel_layer()
    trainer = await layer.new_channel()  # the run's link, as another web process holds it
    await layer.group_add(trainer_group(run.pk), trainer)
    console = console_socket(run.pk, f"sessionid={client.cookies['sessionid'].value}")
    assert (await console.connect())[0]
    assert len(reloads) == 1

    async def send(**message) -> None:
        await console.send_to(text_data=json.dumps(message))

    await send(op="take_over", robot=0)
    refused = json.loads(await console.receive_from())
    assert (refused["type"], refused["status"]) == ("refused", 403)
    for _ in range(VIEW_OPS_BURST):  # as many as a viewer may send at once
        await send(op="watch", robot=0)
        assert (await layer.receive(trainer))["message"]["op"] == "watch"
    assert len(reloads) == 1  # eleven messages, no database read

    operators, _ = await sync_to_async(Group.objects.get_or_create)(name="operator")
    await sync_to_async(vera.groups.add)(operators)
    await send(op="take_over", robot=0)  # no reconnect needed to use a new role
    assert (await layer.receive(trainer))["message"]["op"] == "take_over"
    for n in range(20):
        await send(op="command", robot=0, action=[0.1] * 7, id=f"c{n}")
        assert (await layer.receive(trainer))["message"]["id"] == f"c{n}"
    assert len(reloads) == 2

    await sync_to_async(vera.groups.remove)(operators)
    await send(op="command", robot=0, action=[0.1] * 7, id="refused")
    let_go = (await layer.receive(trainer))["message"]
    assert (let_go["op"], let_go["operator"]) == ("link_lost", "vera")
    assert json.loads(await console.receive_from())["close"] == CLOSE_FORBIDDEN
    assert (await console.receive_output())["code"] == CLOSE_FORBIDDEN
    assert len(reloads) == 3
    with pytest.raises(TimeoutError):  # the command never went to the trainer
        await asyncio.wait_for(layer.receive(trainer), 0.3)
