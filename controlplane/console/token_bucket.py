"""A token bucket: at most `burst` at once, refilled at `per_s` a second."""

import time


class TokenBucket:
    def __init__(self, burst: int, per_s: float) -> None:
        self.burst, self.per_s = burst, per_s
        self.tokens = float(burst)
        self.at = time.monotonic()

    def take(self) -> bool:
        """Whether one more is allowed now (and, if so, count it)."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.per_s)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True
