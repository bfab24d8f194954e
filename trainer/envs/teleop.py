"""An operator's control of env copies (seed 004, the operator console): the
`ActionSource` that a human drives through the control plane, with its safety rules in
one place, whichever transport delivers the operator's messages.

- One operator holds a copy at a time; another is refused with the holder's name.
- Deadman: the operator controls a copy only while heartbeats arrive within
  `deadman_s`; when they stop, the takeover ends ("heartbeat lost") and the copy goes
  back to the policy (`on_link_loss: release`) or is held still (`stop`), with a zero
  action on the very next step either way.
- A command is applied only within `command_window_s` of when it was sent; an older one
  is never applied (the copy gets a zero action instead).
- E-stop holds the copy with zero actions until it is cleared explicitly (`clear_stop`),
  whoever held it.
- Every takeover is recorded (who, copy, start, end, steps, why it ended).

Operator methods may be called from any thread (the link's receiving thread); `act`
and `episode_ended` from the env's. Times are seconds of `clock` (monotonic by default):
the transport stamps each command with that clock when it receives it minus the age the
operator's side measured.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

POLICY, HUMAN, STOPPED, ESTOPPED = "policy", "human", "stopped", "e-stopped"


class TeleopRefused(ValueError):
    """An operator's request that cannot be carried out, with the reason."""


@dataclass(frozen=True)
class TeleopSettings:
    deadman_s: float = 0.2
    command_window_s: float = 0.1
    on_link_loss: Literal["release", "stop"] = "release"


@dataclass
class Takeover:
    """One operator's control of one copy, for the audit."""

    copy: int
    operator: str
    started: float
    ended: float | None = None
    steps: int = 0
    reason: str | None = None


@dataclass
class _Copy:
    mode: str = POLICY
    holder: str | None = None
    heartbeat: float = 0.0
    command: torch.Tensor | None = None
    sent_at: float = 0.0
    takeover: Takeover | None = None
    estopped_by: str | None = None


@dataclass
class TeleopSource:
    num_envs: int
    action_dim: int
    settings: TeleopSettings = field(default_factory=TeleopSettings)
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self._copies = [_Copy() for _ in range(self.num_envs)]
        self._lock = threading.Lock()
        self.takeovers: list[Takeover] = []  # ended ones, oldest first

    # ----- the operator's side ----------------------------------------------------------
    def take_over(self, copy: int, operator: str) -> None:
        with self._lock:
            state = self._copy(copy)
            if state.mode == ESTOPPED:
                raise TeleopRefused(
                    f"copy {copy} is e-stopped by {state.estopped_by}; clear it first"
                )
            if state.holder not in (None, operator):
                raise TeleopRefused(f"copy {copy} is held by {state.holder}")
            if state.holder == operator and state.mode == HUMAN:
                return
            now = self.clock()
            state.mode, state.holder, state.heartbeat = HUMAN, operator, now
            state.command = None
            state.takeover = Takeover(copy, operator, started=now)

    def release(self, copy: int, operator: str) -> None:
        with self._lock:
            state = self._copy(copy)
            self._check_holder(state, copy, operator)
            self._end(state, "released")

    def heartbeat(self, copy: int, operator: str) -> None:
        with self._lock:
            state = self._copy(copy)
            self._check_holder(state, copy, operator)
            state.heartbeat = self.clock()

    def command(self, copy: int, operator: str, action: Sequence[float], sent_at: float) -> None:
        """The operator's action for the next steps (a command is a heartbeat too)."""
        values = torch.as_tensor(action, dtype=torch.float32)
        if values.shape != (self.action_dim,) or not bool(values.isfinite().all()):
            raise TeleopRefused(
                f"an action is {self.action_dim} finite numbers, not {list(values.shape)}"
            )
        with self._lock:
            state = self._copy(copy)
            self._check_holder(state, copy, operator)
            if sent_at >= state.sent_at:  # a late packet never replaces a newer command
                state.command, state.sent_at = values.clamp(-1.0, 1.0), sent_at
            state.heartbeat = self.clock()

    def estop(self, copy: int, operator: str) -> None:
        """Any operator may stop any copy; it stays stopped until cleared."""
        with self._lock:
            state = self._copy(copy)
            if state.mode == HUMAN:
                self._end(state, f"e-stop by {operator}")
            state.mode, state.estopped_by, state.holder = ESTOPPED, operator, None

    def clear_stop(self, copy: int, operator: str) -> None:
        """Give an e-stopped copy, or one held still after its link was lost, back to
        the policy."""
        with self._lock:
            state = self._copy(copy)
            if state.mode not in (ESTOPPED, STOPPED):
                raise TeleopRefused(f"copy {copy} is not stopped ({state.mode})")
            state.mode, state.estopped_by = POLICY, None

    def mode(self, copy: int) -> tuple[str, str | None]:
        """What controls the copy, and who holds it (or stopped it)."""
        with self._lock:
            state = self._copy(copy)
            return state.mode, state.holder or state.estopped_by

    # ----- the env's side (trainer.envs.intervention.ActionSource) ------------------------
    def act(
        self, obs: torch.Tensor, episode_step: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        actions = torch.zeros(self.num_envs, self.action_dim)
        active = torch.zeros(self.num_envs, dtype=torch.bool)
        with self._lock:
            now = self.clock()
            for index, state in enumerate(self._copies):
                if state.mode == HUMAN and now - state.heartbeat > self.settings.deadman_s:
                    self._end(state, "heartbeat lost")
                    if self.settings.on_link_loss == "stop":
                        state.mode = STOPPED
                    active[index] = True  # this step is the zero action either way
                    continue
                if state.mode in (STOPPED, ESTOPPED):
                    active[index] = True  # held still
                elif state.mode == HUMAN:
                    active[index] = True
                    assert state.takeover is not None
                    state.takeover.steps += 1
                    fresh = now - state.sent_at <= self.settings.command_window_s
                    if state.command is not None and fresh:
                        actions[index] = state.command
        return actions, active

    def episode_ended(self, done: torch.Tensor) -> None:
        """A takeover spans episodes: the operator releases it."""

    # ----- helpers ----------------------------------------------------------------------
    def _copy(self, copy: int) -> _Copy:
        if not 0 <= copy < self.num_envs:
            raise TeleopRefused(f"there is no copy {copy}: copies are 0..{self.num_envs - 1}")
        return self._copies[copy]

    def _check_holder(self, state: _Copy, copy: int, operator: str) -> None:
        if state.mode != HUMAN or state.holder != operator:
            holder = f"held by {state.holder}" if state.holder else state.mode
            raise TeleopRefused(f"{operator} does not hold copy {copy} ({holder})")

    def _end(self, state: _Copy, reason: str) -> None:
        """Close the copy's takeover (the lock is held)."""
        if state.takeover is not None:
            state.takeover.ended, state.takeover.reason = self.clock(), reason
            self.takeovers.append(state.takeover)
        state.mode, state.holder, state.command, state.takeover = POLICY, None, None, None
