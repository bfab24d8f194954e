"""The trainer's end of the link under backpressure, against small WebSocket servers
that answer as each test says: at most a window of messages in flight, a long spool
read back a window at a time, and what the client does with each kind of answer."""

import json
import threading
import tracemalloc

from websockets.sync.server import ServerConnection, serve

from tests.processes import free_port
from trainer.link.client import TrainerLink
from trainer.link.protocol import MAX_EVENT_DATA_CHARS, MAX_IN_FLIGHT
from trainer.link.spool import Spool


class Server:
    """A WebSocket server on a port of its own, running `handle` per connection."""

    def __init__(self, handle, port: int = 0):
        self.server = serve(handle, "127.0.0.1", port)
        self.url = f"http://127.0.0.1:{self.server.socket.getsockname()[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


def ack(connection: ServerConnection, raw: str | bytes) -> int:
    seq = json.loads(raw)["seq"]
    connection.send(json.dumps({"type": "ack", "seq": seq}))
    return seq


def test_at_most_the_window_is_in_flight_and_the_rest_follows_the_answers():
    """The server answers nothing until it has a full window and a quiet half second:
    the client must have stopped at the window; then everything follows, in order."""
    seen: list[int] = []
    more_while_held: list[str | bytes] = []

    def hold_a_window_then_ack(connection: ServerConnection) -> None:
        held = [connection.recv() for _ in range(MAX_IN_FLIGHT)]
        try:
            more_while_held.append(connection.recv(timeout=0.5))
        except TimeoutError:
            pass
        for raw in held + more_while_held:
            seen.append(ack(connection, raw))
        for raw in connection:
            seen.append(ack(connection, raw))

    server = Server(hold_a_window_then_ack)
    try:
        link = TrainerLink(server.url, 7, "tok")
        sent = 3 * MAX_IN_FLIGHT
        for step in range(1, sent + 1):
            link.progress(step, sent)
        assert link.close(timeout=30) is True
    finally:
        server.close()
    assert more_while_held == []  # nothing beyond the window before an answer came
    assert seen == list(range(1, sent + 1))


def test_a_long_spool_is_read_back_a_window_at_a_time(tmp_path):
    """The control plane is away while 300 messages of ~50 KB are spooled (15 MB, 10 in
    memory): when it is back, they are sent without the spool ever being in memory."""
    port = free_port()
    link = TrainerLink(f"http://127.0.0.1:{port}", 7, "tok", max_pending=10,
                       max_backoff_s=0.2, max_in_flight=16,
                       spool=Spool(tmp_path, attempt=1, key="k"))  # fmt: skip
    blob = "x" * (MAX_EVENT_DATA_CHARS - 15_000)
    for iteration in range(1, 301):
        link.event("checkpoint", {"iteration": iteration, "note": blob})
    assert link.pending() == 300
    seen: list[int] = []

    def ack_all(connection: ServerConnection) -> None:
        for raw in connection:
            seen.append(ack(connection, raw))

    tracemalloc.start()
    try:
        server = Server(ack_all, port=port)
        assert link.close(timeout=120) is True
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        server.close()
    assert seen == list(range(1, 301))
    print(f"peak of Python allocations while resending a 15 MB spool: {peak / 2**20:.1f} MiB")
    assert peak < 5 * 2**20  # a few windows of 16 payloads, not the 15 MB spool


def test_an_error_without_a_seq_drops_nothing_and_one_with_a_seq_is_not_resent(caplog):
    """A refusal names the message by its seq; one without a seq (a refused live console
    frame) cannot name a pending message, so nothing is dropped for it."""
    connections: list[list[int]] = []

    def answer(connection: ServerConnection) -> None:
        connections.append([])
        for raw in connection:
            seq = json.loads(raw)["seq"]
            connections[-1].append(seq)
            if len(connections) > 1:
                ack(connection, raw)
            elif seq == 1:  # refused as invalid: never to be resent
                connection.send(json.dumps({"type": "error", "seq": 1, "error": "no"}))
            elif seq == 2:  # an unnumbered refusal: 2 stays pending
                connection.send(json.dumps({"type": "error", "seq": None, "error": "?"}))
            else:
                return  # the first connection drops after 3: the link reconnects

    port = free_port()
    link = TrainerLink(f"http://127.0.0.1:{port}", 7, "tok", max_backoff_s=0.2)
    for step in (1, 2, 3):  # while the server is away: all three go on its first connection
        link.progress(step, 3)
    server = Server(answer, port=port)
    try:
        assert link.close(timeout=30) is True
    finally:
        server.close()
    assert connections[0] == [1, 2, 3]
    assert connections[1] == [2, 3]  # 2 kept and sent again, 1 dropped for good
    assert "message 1 rejected: no" in caplog.text
    assert "a frame without a seq was refused: ?" in caplog.text


def test_an_acknowledgement_with_a_warning_is_logged_and_the_message_not_resent(caplog):
    received: list[int] = []

    def ack_with_a_warning(connection: ServerConnection) -> None:
        for raw in connection:
            seq = json.loads(raw)["seq"]
            received.append(seq)
            connection.send(json.dumps({"type": "ack", "seq": seq, "warning": "keys refused"}))

    server = Server(ack_with_a_warning)
    try:
        link = TrainerLink(server.url, 7, "tok")
        link.metrics(1, {"new/a": 1.0})
        link.metrics(2, {"new/b": 1.0})
        assert link.close(timeout=30) is True
    finally:
        server.close()
    assert received == [1, 2] and link.warnings == 2
    assert caplog.text.count("stored in part") == 1  # the first, then every 100th
