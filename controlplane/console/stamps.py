"""The one clock an operator's command's age is measured on (docs/console.md, "Command
window"): the process that holds the run's trainer link stamps each command with its
monotonic clock as it writes the command to the link, and names that clock. The trainer
estimates how that clock relates to its own (trainer.robots.server_clock), so neither
machine's wall clock, nor the hop from the operator's web process to this one, enters
the age."""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

# This process's monotonic clock, by a name no other process has: the trainer starts its
# estimate afresh when a command names another clock (its link reconnected elsewhere).
CLOCK_NAME = secrets.token_hex(8)


def stamped_command(message: dict[str, Any]) -> str:
    """An operator's `teleop` message as the text to write to the link now."""
    return json.dumps({**message, "sent_at": time.monotonic(), "clock": CLOCK_NAME})
