"""The operator console's messages on a run's link (docs/link-protocol.md#console).

Two kinds, neither stored nor acknowledged (they are live: a lost one is superseded by
the next):
- ``teleop``: the control plane → the trainer, an operator's command for one robot. The
  web server names the operator (from the logged-in session, never from the browser);
  the process that holds the run's link stamps ``sent_at`` with its monotonic clock as
  it writes the command to the link, and names that clock in ``clock``.
- ``console``: the trainer → the control plane, each robot's state several times a
  second, a camera frame of the robots being watched, replies to commands and which
  commands were applied.

Takeovers are audited through the stored ``takeover`` event (trainer.link.protocol).
Pure pydantic, like the protocol module.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

MAX_ACTION_DIM = 32
MAX_FRAME_CHARS = 400_000  # a base64 JPEG
MAX_ROBOTS = 256
# A robot link (a placed process that steps robots) names itself to the control plane
# with this header: its component and rank. The run's own link sends none.
SOURCE_HEADER = "X-Armature-Source"
ROBOT_SOURCE = re.compile(r"(env|actor)-[0-9]{1,4}")  # an env worker or an actor rank
LEARNER_SOURCE = "learner"  # the run's own link, as the console names its robots' source

Name = Annotated[str, Field(min_length=1, max_length=150)]
CommandId = Annotated[str, Field(min_length=1, max_length=64)]
ClockName = Annotated[str, Field(min_length=1, max_length=64)]
Op = Literal[
    "take_over", "release", "command", "heartbeat", "estop", "clear_stop", "mark", "watch",
    "link_lost",
]  # fmt: skip


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


class Teleop(_Strict):
    type: Literal["teleop"] = "teleop"
    op: Op
    operator: Name
    robot: int | None = Field(None, ge=0)  # which robot (env copy); none for link_lost
    action: list[float] | None = Field(None, max_length=MAX_ACTION_DIM)
    success: bool | None = None  # for mark
    # The time.monotonic() of the web server process holding the link, as it wrote this
    # command to the link; absent until then (the browser's claim is never taken).
    sent_at: float | None = Field(None, ge=0)
    # Names the clock of `sent_at` (one per web server process): a new name means a
    # clock unrelated to the last one (the link reconnected to another process).
    clock: ClockName | None = None
    id: CommandId | None = None  # echoed in the reply and in `applied`
    camera: Name | None = None  # watch / take_over: the camera the console shows
    # clear_stop: set by the web server when the operator is an admin (the access
    # table's `console-clear-any-stop`), who may clear another operator's e-stop; the
    # browser's claim is never taken.
    override: bool = False


class Segment(_Strict):
    """Consecutive steps of an episode that one kind of actor took: the policy, a human
    (an operator's fresh command) or a safety rule holding the robot still."""

    who: Literal["policy", "human", "held"]
    steps: int = Field(ge=1)


class RobotState(_Strict):
    robot: int = Field(ge=0)
    name: Name
    mode: Literal["policy", "human", "stopped", "e-stopped"]
    holder: str | None = Field(None, max_length=150)
    episode: int = Field(ge=0)
    episode_step: int = Field(ge=0)
    policy_action: list[float] = Field(max_length=MAX_ACTION_DIM)
    last_success: bool | None = None
    state: dict[str, list[float]] = Field(default_factory=dict, max_length=16)
    # The gripper as measured (None: no gripper, or not known): where a console's
    # gripper starts when it takes the robot over.
    gripper_closed: bool | None = None
    cameras: list[Name] = Field(default_factory=list, max_length=16)  # what the robot offers
    # The current episode as segments of steps, oldest first.
    timeline: list[Segment] = Field(default_factory=list, max_length=200)


class Frame(_Strict):
    robot: int = Field(ge=0)
    camera: Name
    jpeg: str = Field(max_length=MAX_FRAME_CHARS)  # base64
    width: int = Field(ge=1, le=4096)
    height: int = Field(ge=1, le=4096)


class Reply(_Strict):
    operator: str = Field("", max_length=150)  # whose command (each console shows its own)
    id: CommandId | None = None
    op: str = Field(max_length=20)
    ok: bool
    error: str = Field("", max_length=500)


class Applied(_Strict):
    id: CommandId
    at: float  # the trainer's time.time() when the env stepped with the command


class Console(_Strict):
    type: Literal["console"] = "console"
    time: float
    # Which link the robots came by: set by the control plane from the link (a trainer's
    # own claim is replaced), so a console keeps each process's robots apart.
    source: str | None = Field(None, max_length=64)
    task: str = Field("", max_length=300)
    control_hz: float | None = None
    robots: list[RobotState] = Field(default_factory=list, max_length=MAX_ROBOTS)
    frames: list[Frame] = Field(default_factory=list, max_length=8)
    replies: list[Reply] = Field(default_factory=list, max_length=64)
    applied: list[Applied] = Field(default_factory=list, max_length=256)


class InvalidConsoleMessage(ValueError):
    pass


def parse_teleop(data: Any) -> Teleop:
    return _parse(Teleop, data)


def parse_console(data: Any) -> Console:
    return _parse(Console, data)


def _parse(model: type[BaseModel], data: Any) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise InvalidConsoleMessage(
            "; ".join(
                f"{'.'.join(map(str, issue['loc'])) or 'message'}: {issue['msg']}"
                for issue in error.errors(include_url=False)[:5]
            )
        ) from None
