"""Revoking a login closes its open sockets: on a live daphne, a browser's status, runs,
run and console sockets close with 4401 when the user's password changes, the user is
deactivated or logs out elsewhere, without the page sending anything (the console's
`ping` re-checks too), and with 4403 when a role change takes the door away."""

from __future__ import annotations

import threading

import pytest
from django.contrib.auth import get_user_model
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from controlplane.access.sockets import CLOSE_UNAUTHENTICATED
from tests.controlplane.console.scene import cookie_of, logged_in
from tests.processes import wait_until
from tests.runs import submitted_run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def web(stack_factory):
    stack = stack_factory(ARMATURE_SOCKET_RECHECK_S="0.3")
    stack.start_web()
    return stack


class Socket:
    """A browser's socket, read in a thread until the server closes it."""

    def __init__(self, url: str, path: str, cookie: str) -> None:
        # A generous handshake: beside the whole suite a loaded daphne answers late.
        self.socket = connect(url.replace("http", "ws") + path, origin=url, open_timeout=60,
                              additional_headers={"Cookie": cookie})  # fmt: skip
        self.closed = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for _ in self.socket:
                pass
        except (ConnectionClosed, OSError):
            pass
        finally:
            self.closed.set()


def change_password(user) -> None:
    user.set_password("a-new-password")
    user.save()


def deactivate(user) -> None:
    user.is_active = False
    user.save()


def test_every_browser_socket_of_a_revoked_login_closes_without_a_message(web):
    """Olga's password is changed, Ivan is deactivated; Vera, untouched, stays."""
    run = submitted_run("sockets")
    paths = ["/ws/status/", "/ws/runs/", f"/ws/runs/{run.pk}/", f"/ws/console/{run.pk}/"]
    cookies = {name: cookie_of(logged_in(name, "operator")) for name in ("olga", "ivan", "vera")}
    sockets = {
        (name, path): Socket(web.url, path, cookie) for name, cookie in cookies.items()
        for path in paths
    }  # fmt: skip
    try:
        for (name, path), socket in sockets.items():
            assert not socket.closed.wait(0.3), f"{name}'s {path} closed before the change"
        change_password(get_user_model().objects.get(username="olga"))
        deactivate(get_user_model().objects.get(username="ivan"))
        for (name, path), socket in sockets.items():
            if name != "vera":
                wait_until(socket.closed.is_set, 30, f"{name}'s {path} to close", 0.05)
                assert socket.socket.close_code == CLOSE_UNAUTHENTICATED, (name, path)
        assert not any(s.closed.is_set() for (name, _), s in sockets.items() if name == "vera")
    finally:
        for socket in sockets.values():
            socket.socket.close()


def test_a_consoles_ping_is_rechecked_too(stack_factory):
    stack = stack_factory(ARMATURE_SOCKET_RECHECK_S="600")  # only the ping can notice
    stack.start_web()
    run = submitted_run("ping")
    socket = Socket(stack.url, f"/ws/console/{run.pk}/", cookie_of(logged_in("olga", None)))
    try:
        deactivate(get_user_model().objects.get(username="olga"))
        socket.socket.send('{"op": "ping", "t": 1}')
        wait_until(socket.closed.is_set, 30, "the console to close", 0.05)
        assert socket.socket.close_code == CLOSE_UNAUTHENTICATED
    finally:
        socket.socket.close()
