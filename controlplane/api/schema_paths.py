"""The API schema names each router path once, without its optional trailing slash
(`/api/v1/runs`): the routes answer both spellings (api/urls.py), the schema documents
the one the docs and the CI client use."""

from typing import Any

SLASHED_ROUTES = ("/api/v1/schema/",)  # declared with their slash, answered only so


def without_optional_slashes(result: dict[str, Any], **_: Any) -> dict[str, Any]:
    """A drf-spectacular post-processing hook."""
    result["paths"] = {
        (path[:-1] if path.endswith("/") and path not in SLASHED_ROUTES else path): item
        for path, item in result["paths"].items()
    }
    return result
