"""HTTP to hardware on the network, within bounds: what a robot server or a camera
answers is not trusted, as its address may lead anywhere (trainer.config.addresses).

- No redirect is ever followed: a 3xx is refused, as an error status is.
- A body is read as it arrives, up to a cap, and within a deadline: an endless or
  trickling answer costs a bounded amount of memory and time.
- Bodies are asked for and read uncompressed, so the bytes counted are the bytes kept.
- A request that gets no answer (a port nobody listens on, a host that is silent, a
  connection that broke) is one error, `NoAnswer`, whichever it was: telling them apart
  would map which ports of a network are open. Its cause is not chained, as the
  library's own errors name the port's state.
- A password in the URL is sent as basic auth and kept out of the URL requested, so no
  error of the HTTP library can show it.
"""

from __future__ import annotations

import time

import requests
import urllib3

from trainer.config.addresses import without_credentials

CHUNK_BYTES = 64 * 1024
MIB = 1 << 20


class NoAnswer(Exception):
    """Nothing came back in time; which of the reasons it was is not told."""


class RefusedAnswer(Exception):
    """An answer a client does not take: a redirect, an error status, a body past its cap."""


def open_session(url: str) -> tuple[requests.Session, str]:
    """A session for `url`'s server and the URL to request: `url` without its user info,
    which the session sends as basic auth."""
    bare, auth = without_credentials(url)
    session = requests.Session()
    session.auth = auth
    session.headers["Accept-Encoding"] = "identity"
    return session, bare


def send(
    session: requests.Session, method: str, url: str, timeout_s: float, **options
) -> requests.Response:
    """The answer's status and headers (its body not read yet); a redirect or an error
    status is refused."""
    try:
        response = session.request(
            method, url, timeout=timeout_s, allow_redirects=False, stream=True, **options
        )
    except requests.RequestException:
        raise NoAnswer() from None
    status = response.status_code
    if 300 <= status < 400:
        response.close()
        raise RefusedAnswer(f"a redirect (HTTP {status}), and redirects are never followed")
    if status >= 400:
        response.close()
        raise RefusedAnswer(f"HTTP {status}")
    return response


def read_body(response: requests.Response, limit: int, timeout_s: float) -> bytes:
    """The body of `response`, at most `limit` bytes, all of it within `timeout_s`;
    closes the response."""
    with response:
        declared = response.headers.get("Content-Length", "")
        if declared.isdigit() and int(declared) > limit:
            raise RefusedAnswer(f"more than {size(limit)}")
        deadline = time.monotonic() + timeout_s
        body = bytearray()
        try:
            # read1: what has arrived, up to a chunk (read would wait for a whole chunk).
            while chunk := response.raw.read1(CHUNK_BYTES, decode_content=False):
                body += chunk
                if len(body) > limit:
                    raise RefusedAnswer(f"more than {size(limit)}")
                if time.monotonic() > deadline:
                    raise NoAnswer()
        except (urllib3.exceptions.HTTPError, requests.RequestException, OSError):
            raise NoAnswer() from None
        return bytes(body)


def size(count: int) -> str:
    """A byte count as the caps are written: `1 MiB`, `64 KiB`."""
    if count >= MIB and count % MIB == 0:
        return f"{count // MIB} MiB"
    return f"{count // 1024} KiB" if count % 1024 == 0 else f"{count} bytes"
