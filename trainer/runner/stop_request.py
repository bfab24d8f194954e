"""Stopping a run between iterations when asked to (Ctrl-C, or SIGTERM from Ray when
the job is stopped), so the run leaves a checkpoint to resume from.

The first signal asks; the runner finishes its iteration, saves and returns. A second
signal stops at once, as it would without this.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._event = threading.Event()
        self._previous: dict[int, object] = {}

    def is_set(self) -> bool:
        return self._event.is_set()

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for number in SIGNALS:
                self._previous[number] = signal.signal(number, self._on_signal)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)

    def _on_signal(self, number: int, frame: FrameType | None) -> None:
        if self._event.is_set():  # asked twice: stop now
            raise KeyboardInterrupt
        self.signal_name = signal.Signals(number).name
        self._event.set()
