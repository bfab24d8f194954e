"""JSON bodies under the same bounds as YAML from users: the nesting depth
(`YamlLimits.max_depth`) and no NUL or unpaired surrogate in any string (`"\\u0000"`,
`"\\ud800"` decode to them; PostgreSQL refuses them, a 500 at the first save).

Python's decoder recurses per level: a body of a few thousand `[` raises RecursionError,
which DRF's parser does not catch (a 500). Both are refused here as a 400."""

from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from trainer.config import UNSTORABLE, YamlLimits, unstorable_message


class BoundedJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None):
        limit = YamlLimits.from_env().max_depth
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(too_deep(limit)) from None
        problem = body_problem(data, limit)
        if problem:
            raise ParseError(f"JSON parse error - {problem}")
        return data


def too_deep(limit: int) -> str:
    return (
        f"JSON parse error - the body nests deeper than {limit} levels "
        "(limit ARMATURE_YAML_MAX_DEPTH)"
    )


def body_problem(data: Any, limit: int) -> str:
    """What is wrong with parsed JSON `data`, walked without recursion ("" if nothing)."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            if UNSTORABLE.search(value):
                return unstorable_message(value)
            continue
        if isinstance(value, dict):
            children = [*value.keys(), *value.values()]
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > limit:
            return too_deep(limit).removeprefix("JSON parse error - ")
        stack.extend((child, depth + 1) for child in children)
    return ""
