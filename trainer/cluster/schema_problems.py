"""Where a problem of a `cluster:` section is in its schema, and its issue.

pydantic names a problem by its location (``("node_groups", 1, "accelerators",
"count")``) and a type of its own. Walking that location through the schema's models
finds the `Explain` of the field (its rule and message), the entry it is in (how
messages name it: ``accelerators of node group 'gpu'``) and what can be left out so the
rest of the section can still be read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic_core import ErrorDetails

from .errors import ConfigIssue, Path
from .section_schema import SKIPPABLE, ClusterSection, Entry, Explain, NodeGroupEntry


@dataclass
class Finding:
    """Where one problem is, what explains it, and what to leave out for it."""

    entry: type[Entry]  # the entry the problem is in
    what: str  # that entry, as messages name it
    path: Path  # the problem's key path inside the section
    explain: Explain | None  # None: pydantic's own message says it
    cut: Path | None  # what to leave out so the rest can be read; None: nothing can be
    unknown_key: bool = False  # a key the entry does not have
    unread_ranks: bool = False  # the cut is node_ranks: read as none instead


def locate(problem: ErrorDetails, section: object) -> Finding:
    """Walk the problem's location through the schema: the innermost `Explain` on the way
    explains it, and the deepest optional key or skippable list entry is what can be left
    out without it."""
    loc = problem["loc"]
    entry: type[Entry] = ClusterSection
    what = ClusterSection.what
    explain: Explain | None = ClusterSection.shape
    annotation: Any = ClusterSection
    raw: Any = section
    path: list[str | int] = []
    cut: Path | None = None
    group, index = "", None
    for depth, part in enumerate((*loc, None)):
        bare, metadata = _unwrap(annotation)
        explain = next((m for m in reversed(metadata) if isinstance(m, Explain)), explain)
        if isinstance(bare, type) and issubclass(bare, Entry):
            entry = bare
            if bare is NodeGroupEntry:
                group = _group_name(raw, index)
            what = bare.what.format(group=group, index=index)
            if part is None:
                explain = bare.shape  # the entry itself is no mapping
                break
            known = bare.model_fields.get(str(part))
            path.append(str(part))
            if known is None:  # a key the entry does not have: left out
                cut = tuple(loc[: depth + 1])
                return Finding(entry, what, tuple(path), None, cut, unknown_key=True)
            explain = next((m for m in known.metadata if isinstance(m, Explain)), None)
            if not known.is_required():
                cut = tuple(loc[: depth + 1])
            elif part == "node_ranks" and problem["type"] != "missing":
                cut = tuple(loc[: depth + 1])
                return Finding(entry, what, tuple(path), explain, cut, unread_ranks=True)
            annotation = known.annotation
        elif get_origin(bare) is list and part is not None:
            (item,) = get_args(bare)
            if _skippable(item):
                cut = tuple(loc[: depth + 1])
            annotation, index = item, part
            path.append(part)
        elif get_origin(bare) is dict and part is not None:
            annotation = get_args(bare)[1]
            path.append(str(part))  # keys are text in key paths, as YAML shows them
        else:
            break
        raw = _child(raw, part)
    return Finding(entry, what, tuple(path), explain, cut)


def _unwrap(annotation: Any) -> tuple[Any, list[Any]]:
    """The type under `Annotated[...]` and `X | None`, and the metadata on the way."""
    metadata: list[Any] = []
    while True:
        if get_origin(annotation) is Annotated:
            annotation, *more = get_args(annotation)
            metadata.extend(more)
        elif _is_optional(annotation):
            annotation = next(arg for arg in get_args(annotation) if arg is not type(None))
        else:
            return annotation, metadata


def _is_optional(annotation: Any) -> bool:
    return get_origin(annotation) in (Union, UnionType) and type(None) in get_args(annotation)


def _skippable(item: Any) -> bool:
    _, metadata = _unwrap(item)
    return SKIPPABLE in metadata


def _group_name(raw: Any, index: int | None) -> str:
    label = raw.get("label") if isinstance(raw, Mapping) else None
    if isinstance(label, str) or (isinstance(label, int) and not isinstance(label, bool)):
        return f"'{label}'"
    return f"at node_groups[{index}]"


def _child(raw: Any, part: str | int | None) -> Any:
    if isinstance(raw, Mapping):
        return raw.get(part)
    if isinstance(raw, list) and isinstance(part, int) and 0 <= part < len(raw):
        return raw[part]
    return None


def issue_for(problem: ErrorDetails, found: Finding, root: Path) -> ConfigIssue:
    """The issue of a problem `locate` found, its key path from `root`."""
    path = (*root, *found.path)
    kind = problem["type"]
    if found.unknown_key:
        allowed = ", ".join(found.entry.model_fields)
        message = f"unknown key '{found.path[-1]}' in {found.what}; allowed: {allowed}"
        return ConfigIssue("config.unknown_key", message, path)
    if "." in kind:  # raised by the schema's own validators (ranks): rule and message
        return ConfigIssue(kind, f"{found.what}: {problem['msg']}", path)
    if found.explain is None:  # every field explains its problems; this is a safety net
        return ConfigIssue("cluster.invalid", f"{found.what}: {problem['msg']}", path)
    explain = found.explain
    if kind == "missing" and explain.missing is not None:
        explain = explain.missing
    template = explain.message
    if kind == "less_than_equal" and explain.too_large is not None:
        template = explain.too_large
    value = None if kind == "missing" else problem["input"]
    message = template.format(
        what=found.what,
        value=value,
        type=type(value).__name__,
        key=next((p for p in reversed(found.path) if isinstance(p, str)), ""),
        index=next((p for p in reversed(found.path) if isinstance(p, int)), ""),
        limit=(problem.get("ctx") or {}).get("le"),
    )
    return ConfigIssue(explain.rule, message, path)
