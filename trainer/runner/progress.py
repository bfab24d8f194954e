"""A dependency-free progress display: a redrawn bar on a terminal, a plain line every
tenth of the run when the output is a log file (CI), so logs stay short."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class ProgressBar:
    def __init__(
        self, total: int, start: int = 0, stream: TextIO | None = None, width: int = 24
    ) -> None:
        self.total = total
        self.start = start
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.started = time.monotonic()
        self.interactive = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last_reported_tenth = -1

    def update(self, done: int, summary: str = "") -> None:
        fraction = done / self.total if self.total else 1.0
        elapsed = time.monotonic() - self.started
        finished_here = done - self.start
        remaining = elapsed / finished_here * (self.total - done) if finished_here else 0.0
        filled = int(self.width * fraction)
        line = (
            f"[{'#' * filled}{'-' * (self.width - filled)}] {done}/{self.total} "
            f"{summary} elapsed {_clock(elapsed)} eta {_clock(remaining)}"
        )
        if self.interactive:
            self.stream.write("\r" + line)
            if done >= self.total:
                self.stream.write("\n")
        else:
            tenth = int(fraction * 10)
            if tenth == self._last_reported_tenth and done < self.total:
                return
            self._last_reported_tenth = tenth
            self.stream.write(line + "\n")
        self.stream.flush()
