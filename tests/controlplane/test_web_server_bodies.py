"""The live web server (core/web_server.py, as `./armature up` and the deployments start
it) refuses a request body past the limit as it arrives: 413 before the body is sent or
stored, with a declared length or chunked, whoever asks and wherever; the server's memory
does not take the body in, and it goes on answering."""

import socket
import time

import psutil
import pytest

pytestmark = pytest.mark.django_db(transaction=True)

LIMIT = 64 * 1024


@pytest.fixture
def server(stack_factory):
    stack = stack_factory(ARMATURE_MAX_REQUEST_BYTES=str(LIMIT))
    stack.start_web()
    return stack


def connect(server) -> socket.socket:
    return socket.create_connection((server.host, server.port), timeout=10)


def answer(sock: socket.socket) -> bytes:
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = sock.recv(65536)
        if not chunk:
            break
        received += chunk
    return received


def test_a_declared_length_past_the_limit_is_refused_before_the_body_is_sent(server):
    sock = connect(server)
    sock.sendall(
        b"POST /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\n"
        + f"Content-Length: {400 * 2**20}\r\n\r\n".encode()
    )  # headers only: the answer comes without a byte of the 400 MB
    reply = answer(sock)
    assert reply.startswith(b"HTTP/1.1 413 "), reply[:200]
    assert b"the limit is 65536 bytes" in reply and b"ARMATURE_MAX_REQUEST_BYTES" in reply
    sock.close()


def test_a_chunked_body_is_cut_off_at_the_limit_and_the_server_keeps_its_memory(server):
    web = psutil.Process(server.web.pid)
    before = web.memory_info().rss
    sock = connect(server)
    sock.sendall(
        b"POST /api/v1/experiments HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    piece = b"x" * 65536
    sent, refused = 0, False
    try:
        while sent < 200 * 2**20:  # far past the limit: the server must stop it first
            sock.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            sent += len(piece)
    except OSError:  # the server closed the connection
        refused = True
    assert refused, "the server took 200 MB of a chunked body"
    assert sent < 64 * 2**20
    time.sleep(0.5)
    assert web.memory_info().rss - before < 32 * 2**20

    # Within the limit, requests go on as before.
    sock = connect(server)
    sock.sendall(b"GET /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    assert answer(sock).startswith(b"HTTP/1.1 200 ")
    sock.close()


def test_a_body_within_the_limit_still_reaches_django(server):
    body = b"username=ada&password=" + b"p" * (LIMIT // 2)
    sock = connect(server)
    sock.sendall(
        b"POST /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    reply = answer(sock)
    assert reply.startswith(b"HTTP/1.1 403 "), reply[:200]  # Django's CSRF check answered
    sock.close()
