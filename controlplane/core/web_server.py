"""The web server: daphne, refusing a request body past `MAX_REQUEST_BYTES` as it arrives.

    python -m controlplane.core.web_server -b HOST -p PORT controlplane.asgi:application

takes daphne's own arguments. Twisted reads a whole request body into a file before
daphne sees the request, and daphne then queues all of it in memory for the
application, so the 413 of core/body_limit.py came after both: one unauthenticated
400 MB POST to any page cost the server 400 MB of memory, and as much again on disk.
Here the declared length is checked with the headers and the bytes are counted as they
come (a chunked body declares none); past the limit the client gets 413 and the
connection is closed, before anything is stored or reaches Django. Bodies within the
limit go on as before, and body_limit.py still answers an over-long one that reaches
Django by some other server.
"""

from __future__ import annotations

import sys

from daphne import server
from daphne.cli import CommandLineInterface
from daphne.http_protocol import HTTPFactory, WebRequest


class BoundedRequest(WebRequest):
    """daphne's request, cut off as soon as its body is known to be too large."""

    refused = False
    received = 0

    def gotLength(self, length: int | None) -> None:  # noqa: N802 (Twisted's name)
        if length is not None and length > _limit():
            self._refuse(length)
            length = 0  # nothing of it is kept
        super().gotLength(length)

    def handleContentChunk(self, data: bytes) -> None:  # noqa: N802 (Twisted's name)
        if self.refused:
            return
        self.received += len(data)
        if self.received > _limit():
            self._refuse(None)
            return
        super().handleContentChunk(data)

    def process(self):
        if not self.refused:  # a refused request never reaches the application
            return super().process()
        return None

    def _refuse(self, size: int | None) -> None:
        from controlplane.core.body_limit import too_large_message

        self.refused = True
        body = (too_large_message(size, _limit()) + "\n").encode()
        head = (
            "HTTP/1.1 413 Content Too Large\r\n"
            "Content-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        )
        self.channel.transport.write(head.encode() + body)
        self.channel.transport.loseConnection()


class BoundedHTTPFactory(HTTPFactory):
    def buildProtocol(self, addr):  # noqa: N802 (Twisted's name)
        protocol = super().buildProtocol(addr)
        protocol.requestFactory = BoundedRequest
        return protocol


def _limit() -> int:
    from django.conf import settings  # set up by the time a request arrives

    return settings.MAX_REQUEST_BYTES


# daphne refuses (403) a socket its application has not accepted within 5 s. Ours first
# read the login from the database (access/sockets.py): on a busy server, a refusal then
# only sends the browser back to try again, more load, so a handshake may take longer.
WEBSOCKET_CONNECT_TIMEOUT_S = 30


def main(argv: list[str]) -> None:
    # daphne's server builds its HTTP factory from this name: the one place to put ours.
    server.HTTPFactory = BoundedHTTPFactory
    if not any(arg.startswith("--websocket_connect_timeout") for arg in argv):
        argv = ["--websocket_connect_timeout", str(WEBSOCKET_CONNECT_TIMEOUT_S), *argv]
    CommandLineInterface().run(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
