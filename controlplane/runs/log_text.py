"""A job log's terminal escapes: Ray colours its prefixes (`\\x1b[36m(ActorRank
pid=…)\\x1b[0m`). The run page's panel renders the colours (ansi2html, as classes the
stylesheet colours: the page's policy allows no inline style) and a download strips
every escape, chunk by chunk, so the file reads as plain text; `?ansi=1` keeps them."""

import re
from collections.abc import Iterator

from ansi2html import Ansi2HTMLConverter
from django.utils.safestring import SafeString, mark_safe

# CSI sequences (colours, erase-line, cursor moves) and the two-byte escapes.
ESCAPE = re.compile(rb"\x1b(?:\[[0-?]*[ -/]*[@-~]|[@-Z\\-_])")
# An escape cut by a chunk's end: held back until the next chunk completes it.
UNFINISHED = re.compile(rb"\x1b(?:\[[0-?]*[ -/]*)?$")


def as_html(text: str) -> SafeString:
    """The log's text as HTML: escaped, its SGR colours and bold as `ansi…` classes,
    other escapes dropped."""
    converter = Ansi2HTMLConverter(inline=False, escaped=True, line_wrap=False)
    return mark_safe(converter.convert(text, full=False))  # noqa: S308 - escaped by ansi2html


def without_escapes(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """`chunks` with every terminal escape removed, also one split across two chunks."""
    held = b""
    for chunk in chunks:
        data = held + chunk
        cut = UNFINISHED.search(data)
        held = data[cut.start() :] if cut else b""
        data = data[: cut.start()] if cut else data
        if data:
            yield ESCAPE.sub(b"", data)
    if held:
        yield ESCAPE.sub(b"", held)
