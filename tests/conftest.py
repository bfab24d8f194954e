import os
import shutil
from pathlib import Path

import pytest
from channels.testing import WebsocketCommunicator
from django.conf import settings

from tests.stack import RayHead, Stack

# Ray renices its worker processes (actors, tasks, a job's supervisor and so the trainer
# it starts) to 15. Beside the test run's own processes at 0 (servers, browsers, other
# pytest workers) that starves them on a busy machine: a placed run's actors took
# minutes to start. Every Ray process the tests start inherits this environment.
os.environ.setdefault("RAY_worker_niceness", "0")

# Channels' test communicator gives a WebSocket 1 s to be accepted or refused. Consumers
# read the database when a socket connects (the run, the user's role), which took longer
# on a loaded 2-core CI machine: the suite's in-process sockets get 10 s.
WebsocketCommunicator.connect.__defaults__ = (10,)

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


def pytest_sessionfinish(session: pytest.Session) -> None:
    # The session's own var/ folder (tests/settings.py): database, broker, secrets.
    if settings.VAR_DIR.name.startswith("session-"):
        shutil.rmtree(settings.VAR_DIR, ignore_errors=True)


@pytest.fixture(autouse=True)
def fresh_channel_layer():
    """Each test gets channel layers of its own. A Redis layer keeps its receive lock
    across calls; a test whose event loop ends while a receive holds it would leave
    the next test's loop a lock bound to a dead loop ("bound to a different event
    loop")."""
    yield
    from channels.layers import channel_layers

    channel_layers.backends.clear()


@pytest.fixture(autouse=True)
def ordinary_scheduling():
    """Fails a test that leaves its worker at another scheduling policy than the one it
    had, and puts the old one back. A process at real-time priority hands it to every
    process it starts; on a small machine one busy such process stalls the whole suite
    (SVT-AV1's encoder does this to its caller when run as root)."""
    before = os.sched_getscheduler(0), os.sched_getparam(0)
    yield
    after = os.sched_getscheduler(0), os.sched_getparam(0)
    if after != before:
        os.sched_setscheduler(0, *before)
        pytest.fail(
            f"the test left this process at scheduling policy {after[0]} "
            f"(priority {after[1].sched_priority}); it had {before[0]}"
        )


@pytest.fixture(scope="session")
def ray_head(tmp_path_factory: pytest.TempPathFactory):
    """A local Ray cluster (head with dashboard) of this test session's own."""
    head = RayHead(tmp_path_factory.mktemp("ray-logs"))
    yield head
    head.close()


@pytest.fixture
def stack_factory(django_db_setup, tmp_path_factory: pytest.TempPathFactory):
    """Start web + worker processes against the test database; all stopped after the test."""
    stacks: list[Stack] = []

    def make(**env: str) -> Stack:
        stack = Stack(tmp_path_factory.mktemp("stack"), env)
        stacks.append(stack)
        return stack

    yield make
    for stack in stacks:
        stack.close()


@pytest.fixture
def web(stack_factory) -> Stack:
    """A live web server (daphne) against the test database."""
    stack = stack_factory()
    stack.start_web()
    return stack


@pytest.fixture(scope="module")
def browser():
    """Headless Debian Chromium driven by Playwright (module scope: a session-scoped sync
    Playwright breaks later async tests)."""
    if not CHROMIUM.exists():
        if os.environ.get("ARMATURE_REQUIRE_BROWSER"):
            pytest.fail(f"{CHROMIUM} is missing (apt-get install chromium)")
        pytest.skip(f"{CHROMIUM} is not installed")
    from playwright.sync_api import sync_playwright

    # Sync Playwright keeps an event loop running in this thread, which makes Django
    # refuse ORM calls from the test body; the ORM use there is plain synchronous code.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            yield chromium
            chromium.close()
    finally:
        if previous is None:
            del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous
