""" "Did you mean …?" for a config key the schema does not have: the closest key of the
same section (difflib's ratio, as Python's own NameError suggestions), so a typo such as
`runner.iteratons` names `runner.iterations`."""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Sequence

from pydantic import BaseModel

from trainer.key_paths import format_key_path


def closest_key(root: type[BaseModel], location: Sequence[str | int]) -> str | None:
    """The dotted path of the key nearest to `location`'s last part among its section's
    keys, or None when none is near or the section is not a model."""
    section: type[BaseModel] | None = root
    for part in location[:-1]:
        if isinstance(part, int) or section is None:  # a list's item: the same model
            continue
        field = section.model_fields.get(str(part))
        section = _model_in(field.annotation) if field is not None else None
    if section is None or not isinstance(location[-1], str):
        return None
    names = list(section.model_fields)
    near = difflib.get_close_matches(location[-1], names, n=1, cutoff=0.6)
    if not near:
        return None
    return format_key_path([*location[:-1], near[0]])


def _model_in(annotation: object) -> type[BaseModel] | None:
    """The model a field holds: itself, or inside Optional / a union / a list."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _model_in(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType, list, tuple, dict):
        for argument in typing.get_args(annotation):
            found = _model_in(argument)
            if found is not None:
                return found
    return None
