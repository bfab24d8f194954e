"""Work a browser test does beside its page that publishes to the page's sockets."""

import threading
from collections.abc import Callable
from typing import Any

from django.db import connection


def off_the_loop(work: Callable[..., Any], *args: Any) -> Any:
    """`work(*args)` in a thread of its own, its result or its error: sync Playwright
    keeps an event loop in the test's thread, where publishing through a Redis channel
    layer (async_to_sync) cannot run."""
    result, failures = [], []

    def run() -> None:
        try:
            result.append(work(*args))
        except BaseException as error:  # noqa: BLE001 - re-raised in the test's thread
            failures.append(error)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if failures:
        raise failures[0]
    return result[0]
