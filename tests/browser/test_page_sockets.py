"""In Chromium, against a live daphne: a page's live sockets end with the page, and what
a page's socket pushes lands only on that page.

The pages link plainly, so leaving one unloads it. htmx can also move between pages
inside one document (a boosted link, `hx-boost`), where nothing unloads: the old page's
elements are swapped out and its scripts' sockets live on unless closed. These tests
leave pages by boosted links (`boosted` below makes a page's own link one), the harder
case."""

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from playwright.sync_api import expect

from tests.browser.test_live_controls import Streamer
from tests.processes import wait_until
from tests.runs import submitted_run

CONSOLE_CONFIG = (settings.BASE_DIR / "examples/builtin_rlpd_console.yaml").read_text()

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]


# Every WebSocket this document makes, kept (a boosted link keeps the document, so its
# list spans the pages shown in it); closed ones read readyState CLOSING or CLOSED.
KEEP_SOCKETS = """
window.testSockets = [];
window.WebSocket = class extends window.WebSocket {
  constructor(...args) { super(...args); window.testSockets.push(this); }
};"""


def open_sockets(page, path: str) -> list[str]:
    """The URLs of this document's sockets to `path` that are open or opening."""
    return page.evaluate(
        "path => testSockets.filter(s => s.readyState < 2 && s.url.includes(path)).map(s => s.url)",
        path,
    )


@pytest.fixture
def page(browser, web, settings):
    settings.ARMATURE_WEB_URL = web.url  # this process's broadcasts reach that server
    user = get_user_model().objects.create_user("rita", password="pw-for-tests")
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    page.errors = []  # console errors (htmx logs its own there) and uncaught exceptions
    page.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda error: page.errors.append(str(error)))
    page.add_init_script(KEEP_SOCKETS)
    page.goto(web.url + "/login/")
    page.get_by_label("Username").fill("rita")
    page.get_by_label("Password").fill("pw-for-tests")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Home")).to_be_visible()
    page.web = web
    yield page
    page.close()


def boosted(link):
    """The link, followed by htmx inside this document (as `hx-boost` does)."""
    link.evaluate("a => { a.setAttribute('hx-boost', 'true'); htmx.process(a); }")
    return link


def live(page) -> None:
    expect(page.locator(".live-dot").first).to_be_visible()
    expect(page.locator(".live-dot:not(.on)")).to_have_count(0, timeout=15_000)


def test_a_run_page_left_by_a_boosted_link_takes_its_socket_along(page):
    """Stop a streaming run, go to its experiment's launch form and on to another run's
    page, inside one document: the first page's socket closes as it is left, nothing of
    it reaches the pages after it, and the next run page arrives whole and live."""
    stopped = submitted_run("sockets")
    other = submitted_run(stopped.experiment)
    streamer = Streamer(page.web.url, stopped)
    page.goto(f"{page.web.url}/runs/{stopped.pk}/")
    live(page)
    streamer.start()
    try:
        page.once("dialog", lambda dialog: dialog.accept())  # "Stop run N?"
        page.get_by_role("button", name="Stop").click()
        # A hang guard, not a latency claim: beside the whole suite the web server takes
        # the POST behind the streamer's flood (over 30 s once); a lost click never shows.
        expect(page.locator("#run-header .badge", has_text="cancelling")).to_be_visible(
            timeout=90_000
        )

        boosted(page.locator(".page-head h1 a")).click()
        expect(page.get_by_role("heading", name="Launch")).to_be_visible()
        assert page.evaluate("performance.getEntriesByType('navigation').length") == 1
        wait_until(lambda: not open_sockets(page, f"/ws/runs/{stopped.pk}/"), 10,
                   "the stopped run's socket to close")  # fmt: skip
        step = streamer.step
        wait_until(lambda: streamer.step >= step + 20, 20, "the run to go on reporting")

        boosted(page.get_by_role("link", name=f"run {other.pk}", exact=True)).click()
        expect(page.get_by_role("heading", name=f"Run {other.pk}")).to_be_visible()
        assert page.errors == []
        header = page.locator("#run-header")
        expect(header).to_have_attribute("data-state", "submitting", timeout=15_000)
        live(page)
        step = streamer.step
        wait_until(lambda: streamer.step >= step + 20, 20, "the run to go on reporting")
    finally:
        streamer.stop()
    (left,) = open_sockets(page, "/ws/runs/")
    assert f"/ws/runs/{other.pk}/" in left
    assert page.errors == []


def test_a_socket_that_reconnects_as_its_page_is_left_is_closed(page):
    """The server drops the run page's socket; htmx's ws extension times a reconnect. The
    page is left before it: the socket it then opens for the page that went is closed."""
    run = submitted_run("reconnecting")
    routes = []

    def pass_through(route) -> None:
        route.connect_to_server()
        routes.append(route)

    page.route_web_socket(f"**/ws/runs/{run.pk}/**", pass_through)
    page.goto(f"{page.web.url}/runs/{run.pk}/")
    live(page)
    page.evaluate("htmx.config.wsReconnectDelay = () => 3000")  # time to leave first
    routes[0].close(code=1012)  # "service restart": the extension reconnects
    expect(page.locator("[ws-connect] .live-dot.on")).to_have_count(0)
    boosted(page.locator(".page-head h1 a")).click()
    expect(page.get_by_role("heading", name="Launch")).to_be_visible()
    reconnected = f"() => testSockets.filter(s => s.url.includes('/ws/runs/{run.pk}/')).length == 2"
    page.wait_for_function(reconnected, timeout=10_000)  # the timed reconnect
    page.wait_for_timeout(1000)
    assert open_sockets(page, f"/ws/runs/{run.pk}/") == []
    assert page.errors == []


def test_a_fragment_for_an_element_the_page_does_not_show_is_dropped_quietly(page):
    """What a socket pushes for an element that is not on this page (a page it no longer
    shows) is left out; the rest of the same message is swapped in."""
    routes = []

    def pass_through(route) -> None:
        route.connect_to_server()
        routes.append(route)

    page.route_web_socket("**/ws/status/", pass_through)
    page.reload()
    live(page)
    routes[-1].send('<div id="run-header">stray</div><div id="status-error">probe</div>')
    expect(page.locator("#status-error")).to_have_text("probe")
    expect(page.get_by_text("stray")).to_have_count(0)
    assert page.errors == []


@pytest.mark.parametrize("path", ["/", "/runs/"])
def test_the_live_lists_sockets_close_when_left_by_a_boosted_link(page, path):
    submitted_run("listed")
    page.goto(page.web.url + path)
    live(page)
    assert open_sockets(page, "/ws/")
    boosted(page.get_by_role("navigation").get_by_role("link", name="Experiments")).click()
    expect(page.get_by_role("heading", name="Experiments")).to_be_visible()
    wait_until(lambda: not open_sockets(page, "/ws/"), 10, "the page's sockets to close")
    assert page.errors == []


def test_a_console_left_by_a_boosted_link_closes_its_socket_and_drives_nothing(page):
    """The console page's own socket (console.js) ends with the page: after a boosted
    link to the audit, it is closed and stays closed, nothing throws once a second, and
    the console's keys no longer send anything."""
    run = submitted_run("console-left", CONSOLE_CONFIG)
    page.goto(f"{page.web.url}/console/runs/{run.pk}/")
    wait_until(lambda: open_sockets(page, f"/ws/console/{run.pk}/"), 15, "the console socket")
    page.evaluate("""() => {
      window.testSent = [];
      const send = WebSocket.prototype.send;
      WebSocket.prototype.send = function (data) {
        testSent.push(data);
        return send.call(this, data);
      };
    }""")  # fmt: skip
    boosted(page.get_by_role("link", name="Takeover audit")).click()
    expect(page.get_by_role("heading", name="Takeover audit")).to_be_visible()
    wait_until(lambda: not open_sockets(page, "/ws/console/"), 10, "the console socket closed")
    page.evaluate("testSent.length = 0")
    page.keyboard.press("t")  # take over, had the console's keys stayed
    page.wait_for_timeout(2500)  # two of its reconnect delays and pings
    assert not open_sockets(page, "/ws/console/")
    assert (
        page.evaluate("testSent.filter(s => s.includes('take_over') || s.includes('ping'))") == []
    )
    assert page.errors == []
