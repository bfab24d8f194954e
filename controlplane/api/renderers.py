"""JSON written by orjson for the answers made of thousands of floats (metric series,
success rates): DRF's encoder (the standard library's json with its checks) took 17-18
ms of a 100 ms budget to write nine keys × 1,000 buckets, orjson about 1 ms (measured
with bench/series_queries.py's data)."""

from typing import Any

import orjson
from rest_framework.renderers import BrowsableAPIRenderer, JSONRenderer
from rest_framework.utils.encoders import JSONEncoder

_fallback = JSONEncoder().default  # what orjson does not know (Decimal, lazy strings, …)


class FastJSONRenderer(JSONRenderer):
    def render(self, data: Any, accepted_media_type=None, renderer_context=None) -> bytes:
        if data is None:
            return b""
        return orjson.dumps(data, default=_fallback)


# For views whose answers are series: the fast JSON first, the browsable API kept.
SERIES_RENDERERS = [FastJSONRenderer, BrowsableAPIRenderer]
