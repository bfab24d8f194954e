"""The one YAML reader for text that comes from users: experiment configs, cluster files,
placements, CLI overrides.

YAML lets a few hundred bytes stand for billions of nodes (`&a [*a, *a, …]` nested a few
levels: the "billion laughs"), and lets brackets nest until the reader's recursion gives
out. Whoever walks the result afterwards (key-line tracking, pydantic) pays for every
expanded node, so the limits are enforced while the document is composed, before any of
that work happens:

- the document's size in bytes (checked before parsing);
- its node count with every alias counted as the nodes it stands for;
- the number of alias uses;
- its nesting depth, aliases included;
- and no string may hold a NUL or an unpaired surrogate (written as the escapes `"\\0"`,
  `"\\ud800"`): no database stores them, so they would fail only when saved.

Each limit has a default that fits every real config many times over and an environment
variable to change it (``deploy/ENVIRONMENT.md``). A document past a limit raises
`YamlLimitError`, a `MarkedYAMLError` naming the limit, its value and the line where
reading stopped, so callers that already report YAML syntax errors with their line report
it the same way.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.composer import Composer
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.events import AliasEvent
from ruamel.yaml.nodes import ScalarNode
from ruamel.yaml.scanner import Scanner

__all__ = ["UNSTORABLE", "YamlLimitError", "YamlLimits", "bounded_yaml", "load_bounded"]

# Characters that text from users may not hold: NUL (PostgreSQL refuses it in text and
# JSON) and lone UTF-16 surrogates (not encodable as UTF-8).
UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


@dataclass(frozen=True)
class YamlLimits:
    """Bounds on one YAML document from a user."""

    max_bytes: int = 256 * 1024
    """Size of the document in UTF-8 bytes (``ARMATURE_YAML_MAX_BYTES``). The reader is
    pure Python (a few hundred KB/s), so this also bounds the time of an ordinary-looking
    document; well under the control plane's request limit, so one at the limit fits in
    a form or JSON body."""
    max_nodes: int = 100_000
    """Scalars, sequences and mappings, every alias counted as what it expands to
    (``ARMATURE_YAML_MAX_NODES``)."""
    max_aliases: int = 1_000
    """Alias uses (``*name``) in one document (``ARMATURE_YAML_MAX_ALIASES``)."""
    max_depth: int = 64
    """Nesting of sequences and mappings, aliases expanded (``ARMATURE_YAML_MAX_DEPTH``)."""

    @classmethod
    def from_env(cls) -> YamlLimits:
        """The defaults, each overridable by its environment variable."""
        defaults = cls()
        return cls(
            **{
                field: _env_int(f"ARMATURE_YAML_{field.upper()}", getattr(defaults, field))
                for field in ("max_bytes", "max_nodes", "max_aliases", "max_depth")
            }
        )


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a whole number") from None
    if value < 1:
        raise ValueError(f"{name}={raw!r} must be at least 1")
    return value


class YamlLimitError(MarkedYAMLError):
    """A document past one of the `YamlLimits`; `limit` names which one."""

    def __init__(self, limit: str, problem: str, mark: Any = None) -> None:
        super().__init__(problem=problem, problem_mark=mark)
        self.limit = limit


class BoundedComposer(Composer):
    """ruamel's composer, counting every node as it is built (aliases as the nodes they
    stand for) and stopping at the first limit passed."""

    limits: YamlLimits = YamlLimits()

    def __init__(self, loader: Any = None) -> None:
        super().__init__(loader)
        self._nodes = 0
        self._aliases = 0
        self._level = 0
        # Per composed node: (expanded node count, expanded height), to charge aliases.
        self._weights: dict[int, tuple[int, int]] = {}

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.parser.check_event(AliasEvent):
            event = self.parser.peek_event()
            target = self.anchors.get(event.anchor)
            if target is not None:
                # An alias inside its own anchor (recursive) has no weight yet: count 1.
                size, height = self._weights.get(id(target), (1, 1))
                self._charge_alias(size, height, event.start_mark)
            return super().compose_node(parent, index)
        mark = self.parser.peek_event().start_mark
        self._level += 1
        if self._level > self.limits.max_depth:
            raise self._too_deep(self._level, mark)
        before = self._nodes
        self._count(1, mark)
        node = super().compose_node(parent, index)
        if isinstance(node, ScalarNode) and UNSTORABLE.search(node.value):
            raise YamlLimitError("characters", unstorable_message(node.value), mark)
        self._level -= 1
        self._weights[id(node)] = (self._nodes - before, self._deepest_below(node))
        return node

    def _deepest_below(self, node: Any) -> int:
        """Height of `node` in expanded nodes, from its children's recorded heights."""
        value = node.value
        if not isinstance(value, list):
            return 1
        children = (
            child for item in value for child in (item if isinstance(item, tuple) else (item,))
        )
        return 1 + max((self._weights.get(id(child), (1, 1))[1] for child in children), default=0)

    def _charge_alias(self, size: int, height: int, mark: Any) -> None:
        self._aliases += 1
        if self._aliases > self.limits.max_aliases:
            raise YamlLimitError(
                "max_aliases",
                f"the document uses more than {self.limits.max_aliases} aliases "
                "(limit ARMATURE_YAML_MAX_ALIASES)",
                mark,
            )
        if self._level + height > self.limits.max_depth:
            raise self._too_deep(self._level + height, mark)
        self._count(size, mark)

    def _count(self, nodes: int, mark: Any) -> None:
        self._nodes += nodes
        if self._nodes > self.limits.max_nodes:
            raise YamlLimitError(
                "max_nodes",
                f"the document expands to more than {self.limits.max_nodes} nodes, aliases "
                "counted as the nodes they repeat (limit ARMATURE_YAML_MAX_NODES)",
                mark,
            )

    def _too_deep(self, depth: int, mark: Any) -> YamlLimitError:
        return _too_deep(self.limits, depth, mark)


class FlowDepthGuard:
    """Mixed into ruamel's scanner: refuse a `[`/`{` past the depth limit as it is read.

    The composer's own check comes too late for flow collections: the scanner looks up to
    1,024 characters ahead for a possible `key:` at every open bracket, checking every
    open one each time, so `[[[[…` costs about a second before the first node exists.
    """

    limits: YamlLimits = YamlLimits()

    def fetch_flow_collection_start(self, TokenClass: Any, to_push: str) -> None:  # noqa: N803
        depth = len(self.flow_context) + 1  # type: ignore[attr-defined]
        if depth > self.limits.max_depth:
            raise _too_deep(self.limits, depth, self.reader.get_mark())  # type: ignore[attr-defined]
        super().fetch_flow_collection_start(TokenClass, to_push)  # type: ignore[misc]


def _too_deep(limits: YamlLimits, depth: int, mark: Any) -> YamlLimitError:
    return YamlLimitError(
        "max_depth",
        f"the document nests deeper than {limits.max_depth} levels "
        f"(reached {depth}; limit ARMATURE_YAML_MAX_DEPTH)",
        mark,
    )


def unstorable_message(text: str) -> str:
    """What is wrong with a string that `UNSTORABLE` matches."""
    found = UNSTORABLE.search(text)
    assert found is not None
    code = f"U+{ord(found.group()):04X}"
    what = "a NUL character" if found.group() == "\x00" else "an unpaired surrogate"
    return (
        f"a string holds {what} ({code} at character {found.start() + 1}), which cannot be stored"
    )


def bounded_yaml(typ: str = "safe", limits: YamlLimits | None = None) -> YAML:
    """A ruamel `YAML` of kind `typ` ("safe" or "rt") that composes within `limits`,
    reading YAML 1.2, where `1:2` stays text (YAML 1.1 reads it as the base-60 number 62).
    """
    bounds = {"limits": limits or YamlLimits()}
    yaml = YAML(typ=typ, pure=True)
    if typ == "safe":
        yaml.version = (1, 2)  # the round-trip loader reads 1.2 already
    yaml.Composer = type("LimitedComposer", (BoundedComposer,), bounds)
    yaml.Scanner = type("LimitedScanner", (FlowDepthGuard, yaml.Scanner or Scanner), bounds)
    return yaml


def load_bounded(text: str | bytes, typ: str = "safe", limits: YamlLimits | None = None) -> Any:
    """Parse one YAML document within `limits` (by default `YamlLimits.from_env()`).

    Raises `YamlLimitError` past a limit, another `YAMLError` for invalid YAML.
    """
    limits = limits or YamlLimits.from_env()
    size = len(text) if isinstance(text, bytes) else len(text.encode("utf-8", "replace"))
    if size > limits.max_bytes:
        raise YamlLimitError(
            "max_bytes",
            f"the document is {size} bytes, over the limit of {limits.max_bytes} bytes "
            "(ARMATURE_YAML_MAX_BYTES)",
        )
    try:
        return bounded_yaml(typ, limits).load(text)
    except ValueError as error:
        if isinstance(error, YAMLError):
            raise
        # e.g. an integer of more digits than Python converts (sys.int_info)
        raise YamlLimitError("value", f"a value cannot be read: {error}") from None
