"""The control plane's clock, as seen from the trainer: how an operator's command's age is
measured on one clock, whatever either machine's wall clock says (docs/console.md,
"Command window").

The web server process that holds the run's link stamps each command with its
`time.monotonic()` as it writes it to the link (`sent_at`, naming that clock in
`clock`). Here each stamp is paired with our own clock's reading when the command
arrived. The offset θ between the two clocks (server − ours) is bounded from below by
every pair, since a message's transit takes no negative time:

    θ ≥ sent_at − arrival

so the estimate is the greatest of them, started afresh whenever the stamps come from
another clock (a reconnect to another web server process). A command's send time in our
clock is then `sent_at − θ`, and its age at any later moment `now − (sent_at − θ)`:
`arrival + θ − sent_at` in transit (measured against the fastest transit seen) plus
`now − arrival` waiting here.

Two free-running clocks drift apart (quartz: tens of parts per million). An old pair
bounds θ less tightly as time passes, by up to `DRIFT_BOUND` seconds per second, so
each pair's bound is loosened at that rate: the estimate never exceeds θ, which would
make fresh commands look old. Commands come every 25 ms while an operator drives, and
each is a new pair.
"""

from __future__ import annotations

import threading

# The most two machines' monotonic clocks are assumed to drift apart, in seconds per
# second (100 ppm: twice a common crystal's tolerance).
DRIFT_BOUND = 1e-4


class ServerClock:
    """Our estimate of the offset between one server clock and ours."""

    def __init__(self, drift_bound: float = DRIFT_BOUND) -> None:
        self.drift_bound = drift_bound
        self._lock = threading.Lock()
        self._clock: str | None = None
        # max over pairs of (sent_at − arrival + drift_bound · arrival): the offset at
        # our time t is this minus drift_bound · t (each pair's bound loosened since).
        self._best: float | None = None

    def local_time(self, sent_at: float, arrival: float, clock: str | None) -> float:
        """`sent_at` of server clock `clock` in our clock, with the pair (sent_at,
        arrival) taken into the estimate first (so the result is never after
        `arrival`)."""
        with self._lock:
            if clock != self._clock:
                self._clock, self._best = clock, None
            pair = sent_at - arrival + self.drift_bound * arrival
            self._best = pair if self._best is None else max(self._best, pair)
            offset = self._best - self.drift_bound * arrival
        return min(sent_at - offset, arrival)  # equal for the best pair, but for rounding

    def offset(self, now: float) -> float | None:
        """The estimated offset (server − ours) at our time `now`; None before any pair."""
        with self._lock:
            return None if self._best is None else self._best - self.drift_bound * now
