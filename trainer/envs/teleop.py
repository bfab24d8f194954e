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
- An action is `action_dim` finite numbers, clamped to [-1, 1] (`operator_action`, the
  one place that decides it: the env and a robot's driver get the same action).
- Taking over never moves the gripper: it stays as it is (a 0 component) until the
  operator's own gripper command changes (`_own_gripper`).
- E-stop holds the copy with zero actions until it is cleared explicitly (`clear_stop`),
  whoever held it; only the operator who pressed it, or an admin (the control plane
  says so with `override`), may clear it. Both are recorded for the audit.
- Every takeover is recorded (who, copy, start, end, steps, why it ended).
- An operator may end a copy's episode as a success or a failure (`mark`): the env step
  after it says so (success is terminal with reward 1, failure a truncation).
- While an operator holds a copy (or always, with `real_time`), steps are paced to
  `control_hz`, so the simulated robot moves at a rate a person can steer (a real
  robot's env paces itself).

Operator methods may be called from any thread (the link's receiving thread); `act`
and `episode_ended` from the env's. Times are seconds of `clock` (monotonic by default),
a command's `sent_at` too: the transport (trainer.robots.console_bridge) turns the
control plane's stamp into this clock's time, so a command's age is measured without
either machine's wall clock (docs/console.md, "Command window").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import torch

from trainer.envs.intervention import SourceActions
from trainer.envs.vector_env import EnvStep

POLICY, HUMAN, STOPPED, ESTOPPED = "policy", "human", "stopped", "e-stopped"
HELD = "held"  # a timeline's step a safety rule held still (zero action)
# The timeline of a copy's episode keeps at most this many segments: a longer one merges
# its oldest two (an operator reads the latest, the total steps stay right).
MAX_SEGMENTS = 200


class TeleopRefused(ValueError):
    """An operator's request that cannot be carried out, with the reason."""


# Each of an operator's action's components is held to this range (the env's and a
# robot driver's unit: a full-scale end-effector delta, the gripper fully open/closed).
ACTION_LIMIT = 1.0


def operator_action(action: Sequence[float], action_dim: int) -> torch.Tensor:
    """The one decision of what an operator's action becomes, for the env and for a
    robot's driver alike: exactly `action_dim` finite numbers, each clamped to
    [-ACTION_LIMIT, ACTION_LIMIT] (1e30 drives at full scale, no further). A wrong
    length, NaN or an infinity is refused (`TeleopRefused`): nothing of it is applied,
    and the copy's last command ages out of its window as usual."""
    try:  # float64 first: 1e39 is finite, though float32 would make it an infinity
        values = torch.as_tensor(action, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        values = torch.empty(0)
    if values.shape != (action_dim,):
        raise TeleopRefused(f"an action is {action_dim} finite numbers, not {list(values.shape)}")
    if not bool(values.isfinite().all()):
        raise TeleopRefused(f"an action is {action_dim} finite numbers, not NaN or infinity")
    return values.clamp(-ACTION_LIMIT, ACTION_LIMIT).to(torch.float32)


@dataclass(frozen=True)
class TeleopSettings:
    deadman_s: float = 0.15
    command_window_s: float = 0.1
    on_link_loss: Literal["release", "stop"] = "release"
    control_hz: float | None = None  # steps per second while a human holds a copy
    real_time: bool = False  # at control_hz always, held or not (as a real arm)


@dataclass
class CopyStatus:
    """What the console shows of one copy."""

    copy: int
    mode: str
    holder: str | None
    episode: int
    episode_step: int
    policy_action: list[float]
    last_success: bool | None  # how the copy's previous episode ended
    # The current episode so far as (who acted, steps) segments, oldest first: "policy",
    # "human" (an operator's fresh command) or "held" (a safety rule's zero action).
    timeline: list[tuple[str, int]] = field(default_factory=list)


@dataclass
class Takeover:
    """One operator's control of one copy, for the audit."""

    copy: int
    operator: str
    started: float
    ended: float | None = None
    steps: int = 0
    reason: str | None = None


@dataclass(frozen=True)
class StopRecord:
    """An e-stop pressed or cleared, for the audit."""

    copy: int
    action: Literal["pressed", "cleared"]
    operator: str
    at: float
    stopped_by: str | None = None  # cleared: who had pressed it
    override: bool = False  # cleared by an admin, not by who pressed it


@dataclass
class _Copy:
    mode: str = POLICY
    holder: str | None = None
    heartbeat: float = 0.0
    command: torch.Tensor | None = None
    sent_at: float = 0.0
    takeover: Takeover | None = None
    estopped_by: str | None = None
    zero_next: bool = False  # the operator was lost: the next step is a zero action
    # The takeover's first gripper command (its sign): where the operator's console
    # started, not a command of theirs; the gripper moves once they change it.
    grip_from: float | None = None
    grip_moved: bool = False
    outcome: bool | None = None  # an operator's mark, applied on the next step
    command_id: str | None = None  # the command to report as applied (see `on_applied`)
    episode: int = 0
    episode_step: int = 0
    last_success: bool | None = None
    timeline: list[list] = field(default_factory=list)  # [who, steps] segments

    def record(self, who: str) -> None:
        """One step of the current episode, taken by `who`."""
        if self.timeline and self.timeline[-1][0] == who:
            self.timeline[-1][1] += 1
            return
        self.timeline.append([who, 1])
        if len(self.timeline) > MAX_SEGMENTS:
            (first, steps), (_, more) = self.timeline[0], self.timeline[1]
            self.timeline[:2] = [[first, steps + more]]


@dataclass
class TeleopSource:
    num_envs: int
    action_dim: int
    settings: TeleopSettings = field(default_factory=TeleopSettings)
    clock: Callable[[], float] = time.monotonic
    # Told (from the env's thread) when a command given an id was first applied, with
    # the clock's time: the console's latency figure and bench/teleop.py.
    on_applied: Callable[[str, float], None] | None = None
    # The action's component that drives a gripper (> 0 and < 0 its two states in the
    # env's convention, exactly 0 keeps it); None: the env has none.
    gripper_dim: int | None = None

    def __post_init__(self) -> None:
        self._copies = [_Copy() for _ in range(self.num_envs)]
        self._lock = threading.Lock()
        self.takeovers: list[Takeover] = []  # ended ones, oldest first
        self.stops: list[StopRecord] = []  # e-stops pressed and cleared, oldest first
        self._last_act = 0.0
        self._policy_actions: torch.Tensor | None = None  # the policy's last [N, dim]

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
            state.command, state.grip_from, state.grip_moved = None, None, False
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

    def command(
        self,
        copy: int,
        operator: str,
        action: Sequence[float],
        sent_at: float,
        command_id: str | None = None,
    ) -> list[float] | None:
        """The operator's action for the next steps (a command is a heartbeat too), as
        `operator_action` makes it, its gripper kept as it is until the operator changes
        it (`_own_gripper`). Returns that action when it replaced the copy's command,
        None when a newer one was already there (a late packet): what a robot's driver
        may be sent, and nothing else. `sent_at` is in `clock`'s time."""
        values = operator_action(action, self.action_dim)
        with self._lock:
            state = self._copy(copy)
            self._check_holder(state, copy, operator)
            state.heartbeat = self.clock()
            if sent_at < state.sent_at:  # a late packet never replaces a newer command
                return None
            self._own_gripper(state, values)
            state.command, state.sent_at = values, sent_at
            state.command_id = command_id
        return values.tolist()

    def mark(self, copy: int, operator: str, success: bool) -> None:
        """End the copy's episode on its next step, as a success or a failure."""
        with self._lock:
            state = self._copy(copy)
            if state.holder not in (None, operator):
                raise TeleopRefused(f"copy {copy} is held by {state.holder}")
            state.outcome = bool(success)

    def link_lost(self, operator: str) -> list[int]:
        """The operator's connection is gone: every copy they hold is let go at once
        (as the deadman would, without waiting for it). The copies let go."""
        with self._lock:
            held = [
                index
                for index, state in enumerate(self._copies)
                if state.mode == HUMAN and state.holder == operator
            ]
            for index in held:
                self._lose(self._copies[index], "operator link lost")
        return held

    def estop(self, copy: int, operator: str) -> None:
        """Any operator may stop any copy; it stays stopped until cleared."""
        with self._lock:
            state = self._copy(copy)
            if state.mode == HUMAN:
                self._end(state, f"e-stop by {operator}")
            if state.mode != ESTOPPED:  # pressed again: the first one's operator clears it
                state.estopped_by = operator
                self.stops.append(StopRecord(copy, "pressed", operator, self.clock()))
            state.mode, state.holder = ESTOPPED, None

    def clear_stop(self, copy: int, operator: str, *, override: bool = False) -> None:
        """Give an e-stopped copy, or one held still after its link was lost, back to
        the policy. An e-stop is cleared by the operator who pressed it, or with
        `override` (an admin, as the control plane decides)."""
        with self._lock:
            state = self._copy(copy)
            if state.mode not in (ESTOPPED, STOPPED):
                raise TeleopRefused(f"copy {copy} is not stopped ({state.mode})")
            stopped_by = state.estopped_by
            if state.mode == ESTOPPED:
                if stopped_by != operator and not override:
                    raise TeleopRefused(
                        f"copy {copy} was e-stopped by {stopped_by}: only they or an admin "
                        "may clear it"
                    )
                overridden = stopped_by != operator
                self.stops.append(StopRecord(copy, "cleared", operator, self.clock(),
                                             stopped_by, overridden))  # fmt: skip
            state.mode, state.estopped_by = POLICY, None

    def end_all(self, reason: str) -> None:
        """End every takeover under way (the run is over)."""
        with self._lock:
            for state in self._copies:
                if state.mode == HUMAN:
                    self._end(state, reason)

    def mode(self, copy: int) -> tuple[str, str | None]:
        """What controls the copy, and who holds it (or stopped it)."""
        with self._lock:
            state = self._copy(copy)
            return state.mode, state.holder or state.estopped_by

    def status(self) -> list[CopyStatus]:
        with self._lock:
            # The deadman runs here too: an env that is not stepping (a worker waiting on
            # its learner, a slow reset) still lets go of a silent operator on time, and
            # the console and the audit say so then, not at the next step.
            self._expire_heartbeats(self.clock())
            wanted = self._policy_actions
            actions = wanted.round(decimals=3).tolist() if wanted is not None else None
            return [
                CopyStatus(
                    index,
                    s.mode,
                    s.holder or s.estopped_by,
                    s.episode,
                    s.episode_step,
                    actions[index] if actions is not None else [],
                    s.last_success,
                    [(who, steps) for who, steps in s.timeline],
                )  # fmt: skip
                for index, s in enumerate(self._copies)
            ]

    # ----- the env's side (trainer.envs.intervention.ActionSource) ------------------------
    def act(self, obs: torch.Tensor, episode_step: torch.Tensor) -> SourceActions:
        """Copies held by an operator or held still take the source's action; of those,
        only a copy whose operator's command is fresh is a human's step (a
        demonstration); the rest get a zero action and are safety holds."""
        self._pace()
        actions = torch.zeros(self.num_envs, self.action_dim)
        active = torch.zeros(self.num_envs, dtype=torch.bool)
        human = torch.zeros(self.num_envs, dtype=torch.bool)
        applied: list[str] = []
        with self._lock:
            now = self.clock()
            self._expire_heartbeats(now)
            for index, state in enumerate(self._copies):
                state.episode_step = int(episode_step[index])
                if state.mode in (STOPPED, ESTOPPED) or state.zero_next:
                    active[index] = True  # held still, or the zero action after a loss
                    state.zero_next = False
                    state.record(HELD)
                elif state.mode == HUMAN:
                    active[index] = True
                    assert state.takeover is not None
                    state.takeover.steps += 1
                    fresh = now - state.sent_at <= self.settings.command_window_s
                    if state.command is not None and fresh:
                        actions[index] = state.command
                        human[index] = True
                        if state.command_id is not None:
                            applied.append(state.command_id)
                            state.command_id = None
                    state.record(HUMAN if human[index] else HELD)
                else:
                    state.record(POLICY)
        if self.on_applied is not None:
            for command_id in applied:
                self.on_applied(command_id, now)
        return SourceActions(actions, active, human)

    def after_step(self, policy_actions: torch.Tensor, step: EnvStep) -> EnvStep:
        """Note what the policy wanted and apply the operators' marks to the step."""
        with self._lock:
            marked = {i: s.outcome for i, s in enumerate(self._copies) if s.outcome is not None}
            # Kept as the tensor: the console reads it a few times a second, the env
            # steps far more often.
            self._policy_actions = policy_actions.detach().clone()
            for state in self._copies:
                state.outcome = None
        if marked:
            step = _with_outcomes(step, marked)
        with self._lock:
            for index in step.done.nonzero().flatten().tolist():
                state = self._copies[index]
                state.episode += 1
                state.last_success = bool(step.success[index])
                state.timeline = []  # the next episode's, from its first step
        return step

    def episode_ended(self, done: torch.Tensor) -> None:
        """A takeover spans episodes: the operator releases it."""

    def _pace(self) -> None:
        """Hold the step to `control_hz` while a human holds a copy, or always in real
        time (outside the lock: the operator's messages keep arriving meanwhile)."""
        hz = self.settings.control_hz
        if hz and (self.settings.real_time or any(s.mode == HUMAN for s in self._copies)):
            wait = self._last_act + 1.0 / hz - time.monotonic()
            if wait > 0:
                time.sleep(wait)
        self._last_act = time.monotonic()

    # ----- helpers ----------------------------------------------------------------------
    def _copy(self, copy: int) -> _Copy:
        if not 0 <= copy < self.num_envs:
            raise TeleopRefused(f"there is no copy {copy}: copies are 0..{self.num_envs - 1}")
        return self._copies[copy]

    def _check_holder(self, state: _Copy, copy: int, operator: str) -> None:
        if state.mode != HUMAN or state.holder != operator:
            holder = f"held by {state.holder}" if state.holder else state.mode
            raise TeleopRefused(f"{operator} does not hold copy {copy} ({holder})")

    def _own_gripper(self, state: _Copy, values: torch.Tensor) -> None:
        """Taking over never moves the gripper: a takeover starts from where it is, and
        only the operator's own change of their gripper command moves it. Their console
        sends its gripper with every command (0 until they touch it); the first is where
        it started (it may not know what the robot holds), so until a later command
        differs from it the gripper's component is 0, which keeps it (the lock is held)."""
        if self.gripper_dim is None:
            return
        sign = float(torch.sign(values[self.gripper_dim]))
        if state.grip_from is None:
            state.grip_from = sign
        state.grip_moved |= sign != state.grip_from
        if not state.grip_moved:
            values[self.gripper_dim] = 0.0

    def _expire_heartbeats(self, now: float) -> None:
        """The deadman: end each takeover whose heartbeats stopped (the lock is held)."""
        for state in self._copies:
            if state.mode == HUMAN and now - state.heartbeat > self.settings.deadman_s:
                self._lose(state, "heartbeat lost")

    def _lose(self, state: _Copy, reason: str) -> None:
        """End a takeover whose operator is gone: a zero action on the next step, then
        the policy (`release`) or held still (`stop`). The lock is held."""
        self._end(state, reason)
        state.zero_next = True
        if self.settings.on_link_loss == "stop":
            state.mode = STOPPED

    def _end(self, state: _Copy, reason: str) -> None:
        """Close the copy's takeover (the lock is held)."""
        if state.takeover is not None:
            state.takeover.ended, state.takeover.reason = self.clock(), reason
            self.takeovers.append(state.takeover)
        state.mode, state.holder, state.command, state.takeover = POLICY, None, None, None


def _with_outcomes(step: EnvStep, marked: dict[int, bool]) -> EnvStep:
    """`step` with the marked copies' episodes ended: a success is terminal with reward
    1, a failure a truncation (the state is not terminal; it bootstraps)."""
    rows = torch.tensor(list(marked))
    success = torch.tensor(list(marked.values()))
    terminated, truncated = step.terminated.clone(), step.truncated.clone()
    solved, reward = step.success.clone(), step.reward.clone()
    terminated[rows], truncated[rows] = success, ~success
    solved[rows] = success
    reward[rows] = torch.where(success, 1.0, reward[rows])
    return replace(step, terminated=terminated, truncated=truncated, success=solved, reward=reward)
