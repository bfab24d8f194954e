"""Streaming a response's body through Django's ASGI handler (the web server is daphne).

Handed a plain iterator, Django's ASGI handler reads the whole of it into a list before
it sends a byte (a multi-GB log or checkpoint held in the web server's memory); handed
an async one, it sends each chunk as it comes. `async_chunks` makes the one the other.
"""

from collections.abc import AsyncIterator, Iterator

from asgiref.sync import sync_to_async


async def async_chunks(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    """`chunks`, read one at a time off the event loop's thread; closed (when it can
    be) once read or when the client leaves."""
    read = sync_to_async(next, thread_sensitive=False)
    try:
        while (chunk := await read(chunks, None)) is not None:
            yield chunk
    finally:
        close = getattr(chunks, "close", None)  # e.g. Ray's response
        if close is not None:
            await sync_to_async(close, thread_sensitive=False)()
