"""`python -m controlplane.core.head_keeper RAY START ARGS…`: how `./armature up` runs
its Ray head. It runs `ray start --head --block`, passing its output on, and starts it
once more when Ray gave up at start-up: `ray start` gives its raylet a fixed 30 s to
register with the GCS and exits otherwise, which a busy machine sees now and then (two
cores, a browser and a training run beside it). Any other exit is the head's own and
ends the keeper with its status, so `up` stops as before. It needs no Django.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from types import FrameType
from typing import TextIO

from controlplane.core.join import NODE_MARKER, kill_leftovers

# What `ray start` prints when its raylet did not register in time (ray/_private/node.py).
RAY_START_DEADLINE = "The current node timed out during startup"
STARTS = 5  # a loaded 2-core machine has missed the deadline three times in a row


class HeadKeeper:
    """Runs `command` up to STARTS times while each start ends at Ray's start-up
    deadline. `ray start` stays in the keeper's process group, so what stops the group
    (`up`'s Ctrl-C: SIGTERM, then SIGKILL) stops the head at once, keeper or not."""

    def __init__(self, command: Sequence[str], env: dict[str, str] | None = None) -> None:
        self.command = list(command)
        self.marker = f"head-{os.getpid()}"  # in the environment of every process it starts
        self.env = {**(os.environ if env is None else env), NODE_MARKER: self.marker}
        self.head: subprocess.Popen | None = None
        self.stopping = False

    def stop(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True
        if self.head is not None and self.head.poll() is None:
            self.head.send_signal(signum)  # the group had it already, unless it was sent to us

    def run(self) -> int:
        previous = {sig: signal.signal(sig, self.stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            for start in range(1, STARTS + 1):
                status, timed_out = self._run_once()
                if self.stopping or not timed_out:
                    return status
                # What the failed start left (a GCS, a dashboard) holds the head's ports.
                kill_leftovers(self.marker)
                if start < STARTS:
                    print(
                        "head_keeper: the Ray head gave up at start-up (Ray's 30 s deadline "
                        f"for its raylet); starting it again ({start + 1} of {STARTS})",
                        file=sys.stderr,
                        flush=True,
                    )
            return status
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _run_once(self) -> tuple[int, bool]:
        """The head's exit status, and whether it ended at Ray's start-up deadline."""
        self.head = subprocess.Popen(
            self.command, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, errors="replace",
        )  # fmt: skip
        timed_out = threading.Event()
        reader = threading.Thread(target=self._echo, args=(self.head.stdout, timed_out))
        reader.daemon = True
        reader.start()
        status = self.head.wait()
        # The rest of its output; a process the start left behind may hold the pipe open.
        reader.join(timeout=5)
        return status, timed_out.is_set()

    def _echo(self, output: TextIO, timed_out: threading.Event) -> None:
        for line in output:
            sys.stdout.write(line)
            sys.stdout.flush()
            if RAY_START_DEADLINE in line:
                timed_out.set()


def main(argv: Sequence[str] | None = None) -> int:
    command = list(sys.argv[1:] if argv is None else argv)
    if not command:
        print("usage: python -m controlplane.core.head_keeper RAY START ARGS…", file=sys.stderr)
        return 2
    status = HeadKeeper(command).run()
    return status if status >= 0 else 128 - status  # killed by a signal: as a shell says


if __name__ == "__main__":
    sys.exit(main())
