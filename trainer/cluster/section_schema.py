"""The schema of a `cluster:` section: what each entry may hold, and the rule and message
of each problem.

Types are strict, as YAML writes them: `num_nodes: "4"` or `ignore_hardware: yes` is a
mistake, not a number or a boolean. Only integers are read as text where a name is
expected (`label: 4090`, `OMP_NUM_THREADS: 4`), as they are unambiguous. Each field's
`Explain` gives the rule id callers match on and the message users read;
`trainer.cluster.section_reader` turns pydantic's errors into issues with them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from annotated_types import Len
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationInfo,
    WrapValidator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from .model import VISIBILITY_ENV_VARS
from .ranks import RankOutOfRange, RankSyntaxError, parse_rank_list

MAX_NODES = 100_000  # bounds memory for configs from untrusted input (web forms)
MAX_ACCELERATORS_PER_NODE = 1024


@dataclass(frozen=True)
class Explain:
    """The rule a field's value breaks and its message, as `Annotated` metadata.

    Messages may use `{what}` (the entry: ``node group 'gpu'``), `{value!r}` and `{type}`
    (what was written and its type), `{key}` and `{index}` (the last key and list index
    of its key path) and `{limit}` (the maximum it passed).
    """

    rule: str
    message: str
    missing: Explain | None = None  # the key is absent
    too_large: str | None = None  # the value passes the field's maximum


class _Unread(tuple):
    """node_ranks that could not be read (already reported): read as no ranks, so the
    entry's other fields are still checked and the semantic rules skip its ranks. One
    instance, told apart by identity."""

    __slots__ = ()


UNREAD_RANKS: tuple[int, ...] = _Unread()
# A list entry that could not be read (already reported): left out, its index kept.
SKIPPED: Any = object()
# `Annotated` metadata of the list entries that may be SKIPPED.
SKIPPABLE: Any = object()


def _int_as_text(value: object) -> object:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _ranks(value: object, info: ValidationInfo) -> tuple[int, ...]:
    if value is UNREAD_RANKS:
        return UNREAD_RANKS
    # The limit is checked before a range is expanded, so `0-999999999` costs nothing.
    limit = (info.context or {}).get("num_nodes", MAX_NODES)
    try:
        return tuple(parse_rank_list(value, limit=limit))
    except RankSyntaxError as error:
        rule = (
            "node_ranks.out_of_range" if isinstance(error, RankOutOfRange) else "node_ranks.invalid"
        )
        raise PydanticCustomError(rule, "{message}", {"message": str(error)}) from None


def _known_vendor(vendor: str) -> str:
    if vendor not in VISIBILITY_ENV_VARS:
        raise ValueError(vendor)
    return vendor


def _skipped_or(value: object, handler: Any) -> Any:
    return value if value is SKIPPED else handler(value)


# Rank lists as users write them (`0-7`, `3`, `[0, 2-3]`); the rules are the errors'
# own (node_ranks.invalid, node_ranks.out_of_range).
NodeRanks = Annotated[tuple[int, ...], PlainValidator(_ranks)]
Text = Annotated[StrictStr, BeforeValidator(_int_as_text)]
NumNodes = Annotated[
    StrictInt,
    Field(ge=1, le=MAX_NODES),
    Explain(
        "cluster.num_nodes",
        "num_nodes must be a positive integer, not {value!r}",
        missing=Explain("cluster.num_nodes", "num_nodes is required (the number of nodes)"),
        too_large="num_nodes {value} exceeds the supported maximum of {limit}",
    ),
]
_EXAMPLE_ENV_VAR = "'- GLOO_SOCKET_IFNAME: eth0'"
EnvVar = Annotated[
    dict[
        Annotated[str, BeforeValidator(str)],  # a bad name is the semantic rules' to report
        Annotated[
            Text,
            Explain(
                "env_var.value",
                "env var {key} in {what} must have a string value (quote it); got {type} {value!r}",
            ),
        ],
    ],
    Len(1, 1),
    Explain(
        "env_var.format",
        "env_vars[{index}] in {what} must be a mapping with exactly one key, like "
        f"{_EXAMPLE_ENV_VAR}; got {{value!r}}",
    ),
]


def _ranks_explained(missing: Explain) -> Explain:
    # An unreadable rank list is explained by the rank parser's own error.
    return Explain("node_ranks.invalid", "{what}: node_ranks cannot be read", missing=missing)


class Entry(BaseModel):
    """A mapping of the section. Keys are text, as the key paths of its problems are."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    # What the entry is called in messages; `{group}` names its node group.
    what: ClassVar[str]
    # Its problem when it is no mapping at all.
    shape: ClassVar[Explain]

    @model_validator(mode="before")
    @classmethod
    def _text_keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and not all(isinstance(key, str) for key in data):
            return {str(key): value for key, value in data.items()}
        return data


class AcceleratorsEntry(Entry):
    what = "accelerators of node group {group}"
    shape = Explain(
        "accelerators.format", "{what} must be a mapping such as {{type: A800, count: 8}}"
    )

    type: Annotated[
        Text, Field(min_length=1), Explain("accelerators.type", "{what} need a type such as A800")
    ]
    count: Annotated[
        StrictInt,
        Field(ge=1, le=MAX_ACCELERATORS_PER_NODE),
        Explain(
            "accelerators.count",
            "{what}: count must be a positive integer per node (omit accelerators when "
            "there are none), not {value!r}",
            too_large="{what}: count {value} exceeds {limit} per node",
        ),
    ]
    vendor: Annotated[
        Annotated[StrictStr, AfterValidator(_known_vendor)] | None,
        Explain(
            "accelerators.vendor",
            f"{{what}}: vendor must be one of {', '.join(VISIBILITY_ENV_VARS)}, not {{value!r}}",
        ),
    ] = None


class AcceleratorDeclarationEntry(AcceleratorsEntry):
    """A cluster-level `accelerators:` entry: accelerators of any nodes."""

    what = "cluster-level accelerators[{index}]"
    shape = Explain(
        "accelerators.format",
        "each cluster-level accelerators entry needs node_ranks, type and count, "
        "e.g. {{node_ranks: 0-7, type: A800, count: 8}}",
    )

    node_ranks: Annotated[NodeRanks, _ranks_explained(shape)]


class HardwareConfigEntry(Entry):
    """One device. Keys besides these are kept (`extra`), so an export loses nothing."""

    model_config = ConfigDict(extra="allow", frozen=True)
    what = "a hardware config of node group {group}"
    shape = Explain("hardware.config", "{what} must be a mapping")

    node_rank: Annotated[
        StrictInt, Explain("hardware.node_rank", "{what} needs an integer node_rank")
    ]
    robot_ip: Annotated[
        StrictStr | None,
        Explain("hardware.robot_ip", "robot_ip in {what} must be a quoted address string"),
    ] = None
    camera_serials: Annotated[
        list[StrictStr] | None,
        # Unquoted serials are read as numbers and lose leading zeros.
        Explain(
            "hardware.camera_serials",
            "camera_serials in {what} must be a list of quoted strings (unquoted, 012345 "
            "would be read as the number 12345)",
        ),
    ] = None


class HardwareEntry(Entry):
    what = "the hardware of node group {group}"
    shape = Explain("hardware.type", "{what} must be a mapping with type and configs")

    type: Annotated[
        Text, Field(min_length=1), Explain("hardware.type", "{what} needs a type such as Franka")
    ]
    configs: Annotated[
        list[HardwareConfigEntry],
        Field(min_length=1),
        Explain(
            "hardware.configs",
            "{what} needs configs: a non-empty list with one entry per device, each with "
            "its node_rank",
        ),
    ]


class EnvConfigEntry(Entry):
    what = "env_configs of node group {group}"
    shape = Explain("env_config.type", "each entry of {what} must be a mapping")

    node_ranks: Annotated[
        NodeRanks,
        _ranks_explained(Explain("node_ranks.missing", "each entry of {what} needs node_ranks")),
    ]
    env_vars: Annotated[
        list[EnvVar] | None,
        Explain(
            "env_var.format",
            f"env_vars in {{what}} must be a list of single-key mappings such as "
            f"{_EXAMPLE_ENV_VAR}",
        ),
    ] = None
    python_interpreter_path: Annotated[
        StrictStr | None,
        Explain("interpreter.type", "python_interpreter_path in {what} must be a path string"),
    ] = None


def _skippable(entry: type[Entry]) -> Any:
    return Annotated[entry, WrapValidator(_skipped_or), SKIPPABLE]


class NodeGroupEntry(Entry):
    what = "node group {group}"
    shape = Explain("node_group.type", "a node group must be a mapping")

    label: Annotated[Text, Explain("node_group.label", "a node group needs a string label")]
    node_ranks: Annotated[
        NodeRanks,
        _ranks_explained(Explain("node_ranks.missing", "{what} needs node_ranks (e.g. 0-7)")),
    ]
    env_configs: Annotated[
        list[_skippable(EnvConfigEntry)] | None,
        Explain("env_configs.type", "env_configs must be a list, not {type}"),
    ] = None
    hardware: HardwareEntry | None = None
    accelerators: AcceleratorsEntry | None = None
    ignore_hardware: Annotated[
        StrictBool,
        Explain(
            "node_group.ignore_hardware",
            "ignore_hardware of {what} must be true or false, not {value!r}",
        ),
    ] = False


class ClusterSection(Entry):
    what = "the cluster section"
    shape = Explain("cluster.type", "the cluster section must be a mapping, not {type}")

    num_nodes: NumNodes
    node_groups: Annotated[
        list[_skippable(NodeGroupEntry)] | None,
        Explain("node_groups.type", "node_groups must be a list, not {type}"),
    ] = None
    accelerators: Annotated[
        list[_skippable(AcceleratorDeclarationEntry)] | None,
        Explain("accelerators.type", "accelerators must be a list, not {type}"),
    ] = None
    # Read by `trainer.cluster.placement_spec`, which knows its grammar.
    component_placement: Any = None
