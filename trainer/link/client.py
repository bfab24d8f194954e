"""The trainer's side of the link: a WebSocket to the control plane, run by a background
thread, so that training never waits on the network.

Sends are queue puts. Each message gets the next sequence number, is written to the
spool (once the run's folder is known, `use_spool`) and stays pending until the server
acknowledges it; after a reconnect every unacknowledged message is sent again, in order
(the server stores each (run, attempt, seq) once, so a resend is harmless). At most
MAX_IN_FLIGHT messages are sent and unanswered at a time: a slow control plane slows the
link down rather than filling its memory (it closes a link that sends more). Memory
holds at most `max_pending` payloads: older unacknowledged ones are read back from the
spool as they are sent, a window at a time, never dropped. Without a spool (no run
folder) the oldest are dropped past that bound.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from websockets.exceptions import ConnectionClosed, InvalidStatus, InvalidURI, WebSocketException
from websockets.sync.client import ClientConnection, connect

from trainer.link.console_messages import SOURCE_HEADER
from trainer.link.protocol import (
    MAX_IN_FLIGHT,
    Event,
    EventKind,
    Message,
    Metrics,
    Progress,
    json_safe,
    metric_chunks,
    parse_reply,
)
from trainer.link.spool import Spool

log = logging.getLogger(__name__)

MAX_PENDING = 10_000
INITIAL_BACKOFF_S = 0.2
MAX_BACKOFF_S = 5.0
OPEN_TIMEOUT_S = 5.0
# How long the sender waits for a reply before looking for new messages to send.
POLL_S = 0.005
DEFAULT_FLUSH_TIMEOUT_S = 10.0
# The control plane closes a run's links with this code once the run has ended (its
# token is spent): nothing to retry, nothing to warn about.
CLOSE_RUN_ENDED = 4410
# How often the acknowledged-through mark is written to the spool (a stale mark only
# makes the control plane skip duplicates when it ingests the spool).
ACK_MARK_INTERVAL_S = 0.5
LIVE_BACKLOG = 64


def websocket_url(base_url: str, run_id: int) -> str:
    """``http://host:8000`` → ``ws://host:8000/ws/trainer/<run_id>/`` (https → wss)."""
    base = base_url.rstrip("/")
    if base.startswith("https://"):
        base = "wss://" + base.removeprefix("https://")
    elif base.startswith("http://"):
        base = "ws://" + base.removeprefix("http://")
    return f"{base}/ws/trainer/{run_id}/"


class TrainerLink:
    """A run's link to the control plane. Every public method returns at once."""

    def __init__(
        self,
        url: str,
        run_id: int,
        token: str,
        *,
        flush_timeout_s: float = DEFAULT_FLUSH_TIMEOUT_S,
        max_pending: int = MAX_PENDING,
        max_backoff_s: float = MAX_BACKOFF_S,
        spool: Spool | None = None,
        max_in_flight: int = MAX_IN_FLIGHT,
        source: str | None = None,
    ) -> None:
        """`spool`: where every message is kept until acknowledged (the run's
        link-spool/). One an earlier process of this attempt left there is continued:
        its unacknowledged messages are sent first, and numbering goes on after its
        last one, so no sequence number is used twice.

        Besides acknowledgements the control plane sends operators' commands
        (``{"type": "teleop", ...}``); they go to the handler given to
        `on_command`, called on the link's thread.

        `source`: a robot link's name (`env-<rank>`: a placed process that steps robots,
        trainer.link.environment.robot_link_from_env). It carries live console messages
        and operators' commands only, never stored ones: the run's one sequence of
        stored messages is the driver's link's."""
        self.endpoint = websocket_url(url, run_id)
        self.flush_timeout_s = flush_timeout_s
        self.max_pending = max_pending
        self.max_backoff_s = max_backoff_s
        self.max_in_flight = max_in_flight  # never more than the control plane takes
        self._headers = {"Authorization": f"Bearer {token}"}
        self.source = source
        if source is not None:
            self._headers[SOURCE_HEADER] = source
        self._lock = threading.Lock()
        self._acked_all = threading.Condition(self._lock)
        # seq → payload, or None for a payload kept only in the spool; insertion order
        # is seq order.
        self._pending: dict[int, str | None] = {}
        self._in_memory = 0
        self._next_seq = 1
        self._acked_through = 0
        self._mark_written_at = 0.0
        self._spool = spool
        if spool is not None:
            self._acked_through = spool.acked_through()
            self._pending = {seq: None for seq, _ in spool.messages(after=self._acked_through)}
            self._next_seq = spool.last_seq() + 1
        self._accepting = True
        self._stop = threading.Event()
        # Live console frames: sent once as soon as possible, never stored or resent; the
        # newest are kept when the link is slower than they come.
        self._live: deque[str] = deque(maxlen=LIVE_BACKLOG)
        self._command_handler: Callable[[dict[str, Any]], None] | None = None
        self.refused: str | None = None  # why the server refused the link for good
        self.dropped = 0  # messages given up (no spool and a full buffer, or a full spool)
        self.warnings = 0  # acknowledgements that said a message was stored only in part
        self._unnumbered_errors = 0
        self._thread = threading.Thread(target=self._run, name="armature-link", daemon=True)
        self._thread.start()

    # ----- what the trainer calls ------------------------------------------------------
    def event(self, kind: EventKind, data: dict[str, Any] | None = None) -> None:
        payload = json_safe(data or {})
        self._enqueue(lambda seq: Event(seq=seq, kind=kind, data=payload))

    def metrics(self, step: int, values: dict[str, float], at: float | None = None) -> None:
        wall_time = time.time() if at is None else at
        for chunk in metric_chunks(values):
            self._enqueue(
                lambda seq, c=chunk: Metrics(seq=seq, step=step, time=wall_time, values=c)
            )

    def progress(self, step: int, total: int) -> None:
        self._enqueue(lambda seq: Progress(seq=seq, step=step, total=total))

    def live(self, payload: dict[str, Any]) -> None:
        """Send a console frame (trainer.link.console_messages) without storing it."""
        if self._accepting and self.refused is None:
            self._live.append(json.dumps(payload, allow_nan=False))

    def on_command(self, handler: Callable[[dict[str, Any]], None] | None) -> None:
        self._command_handler = handler

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def close(self, timeout: float | None = None) -> bool:
        """Wait up to `timeout` seconds for every message to be acknowledged, then stop.
        Returns True when every message was acknowledged."""
        timeout = self.flush_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + timeout
        with self._lock:
            self._accepting = False
            while self._pending and self.refused is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._acked_all.wait(remaining)
            left = len(self._pending)
        self._stop.set()
        # Long enough for a clean close handshake; a thread still stuck in a connect
        # attempt is a daemon and cannot hold the process.
        self._thread.join(timeout=2)
        with self._lock:
            spool, self._spool = self._spool, None
        if spool is not None:
            if left:
                spool.mark_acked(self._acked_through)
                spool.close()
                log.warning("link closed with %d unacknowledged messages; they stay in %s "
                            "for the control plane", left, spool.path)  # fmt: skip
            else:
                spool.remove()
        elif left:
            log.warning("link closed with %d unacknowledged messages", left)
        return left == 0 and self.refused is None

    def _enqueue(self, build: Callable[[int], Message]) -> None:
        if self.source is not None:
            raise ValueError(f"the robot link {self.source} carries console messages only")
        try:
            with self._lock:
                if not self._accepting or self.refused is not None:
                    return
                self._add(build(self._next_seq).payload())
        except Exception:  # a bad value must never stop training
            log.exception("link: could not queue a message")

    def _add(self, payload: str) -> None:
        """Spool and keep the payload of message `_next_seq`; the lock is held."""
        seq = self._next_seq
        if self._spool is not None and not self._spool.append(payload):
            self._drop(f"the spool {self._spool.path} is full ({self._spool.limit_bytes} bytes)")
            return
        self._next_seq += 1
        self._pending[seq] = payload
        self._in_memory += 1
        if self._in_memory <= self.max_pending:
            return
        # The oldest payload still in memory.
        old_seq = next(seq for seq, old in self._pending.items() if old is not None)
        if self._spool is not None:
            self._pending[old_seq] = None  # read back from the spool when sent
        else:
            del self._pending[old_seq]
            self._drop("the buffer is full and there is no spool")
        self._in_memory -= 1

    def _drop(self, why: str) -> None:
        self.dropped += 1
        if self.dropped == 1:
            log.warning("link: dropping messages: %s", why)

    # ----- the background thread ---------------------------------------------------------
    def _run(self) -> None:
        backoff = INITIAL_BACKOFF_S
        down_since: float | None = None
        while not self._stop.is_set():
            try:
                with connect(
                    self.endpoint,
                    additional_headers=self._headers,
                    open_timeout=OPEN_TIMEOUT_S,
                    close_timeout=1,
                ) as socket:
                    if down_since is not None:
                        log.info("link to %s is back; resending %d", self.endpoint, self.pending())
                    down_since, backoff = None, INITIAL_BACKOFF_S
                    self._pump(socket)
                    return  # stopped
            except InvalidStatus as error:
                status = error.response.status_code
                if 400 <= status < 500:  # a bad token or a finished run: retrying cannot help
                    self._refuse(f"HTTP {status} at the handshake")
                    return
                failure = f"HTTP {status}"
            except InvalidURI as error:
                self._refuse(str(error))
                return
            except ConnectionClosed as error:
                code = error.rcvd.code if error.rcvd is not None else None
                if code == CLOSE_RUN_ENDED:
                    self._refuse("the run has ended", expected=True)
                    return
                if code is not None and 4400 <= code < 4500:
                    self._refuse(f"closed with {code} {error.rcvd.reason}")
                    return
                failure = f"connection closed ({code})"
            except (OSError, TimeoutError, WebSocketException) as error:
                failure = f"{type(error).__name__}: {error}"
            except Exception as error:  # the thread must outlive any surprise
                log.exception("link: unexpected error")
                failure = repr(error)
            if down_since is None:
                down_since = time.monotonic()
                log.warning("link to %s is down (%s); retrying", self.endpoint, failure)
            self._stop.wait(backoff)
            backoff = min(backoff * 2, self.max_backoff_s)

    def _pump(self, socket: ClientConnection) -> None:
        """Send what is new (on a fresh connection: everything unacked), read replies."""
        sent_upto = 0
        reader = _SpoolReader(self._spool) if self._spool is not None else None
        while not self._stop.is_set():
            for seq, payload in self._outgoing(sent_upto, reader):
                socket.send(payload)
                sent_upto = seq
            while self._live:
                socket.send(self._live.popleft())
            # Every reply that has come, before sending more: each frees a place in the
            # window of messages in flight.
            timeout = POLL_S
            for _ in range(self.max_in_flight):
                try:
                    raw = socket.recv(timeout=timeout)
                except TimeoutError:
                    break
                self._on_reply(raw)
                timeout = 0

    def _outgoing(self, sent_upto: int, reader: _SpoolReader | None) -> list[tuple[int, str]]:
        """The pending messages after `sent_upto`, in order, as many as the window of
        `max_in_flight` unanswered messages has room for; those kept only in the spool
        are read back from it."""
        with self._lock:
            if self._next_seq - 1 <= sent_upto:
                return []
            room = self.max_in_flight
            wanted: list[tuple[int, str | None]] = []
            # In seq order, those sent on this connection and not answered come first.
            for seq, payload in self._pending.items():
                if len(wanted) >= room:
                    break
                if seq <= sent_upto:
                    room -= 1
                else:
                    wanted.append((seq, payload))
        if reader is not None:
            # Outside the lock: a pass over a long spool must not hold up training.
            wanted = [(seq, p if p is not None else reader.payload(seq)) for seq, p in wanted]
        lost = [seq for seq, payload in wanted if payload is None]
        if lost:  # their spool lines are gone or unreadable: they can never be sent
            with self._lock:
                for seq in lost:
                    self._pending.pop(seq, None)
                    self._drop(f"message {seq} could not be read back from the spool")
                if not self._pending:
                    self._acked_all.notify_all()
        return [(seq, payload) for seq, payload in wanted if payload is not None]

    def _on_reply(self, raw: str | bytes) -> None:
        try:
            data = json.loads(raw)
        except ValueError:
            data = None
        if isinstance(data, dict) and data.get("type") == "teleop":
            self._command(data)
            return
        reply = parse_reply(data)
        if reply is None:
            log.warning("link: unexpected reply %.200r", raw)
            return
        if reply.seq is None:
            # A refused frame that had no valid seq: a live console frame (never kept), as
            # no message this link numbered lacks one. Nothing pending to drop.
            self._unnumbered_errors += 1
            if self._unnumbered_errors == 1:
                log.warning("link: a frame without a seq was refused: %.300s", reply.error)
            return
        if reply.type == "error":
            # Refused as invalid: the server will never take this message, so it is
            # dropped here, not resent (keeping it would only block flushing).
            log.warning("link: message %d rejected: %s", reply.seq, reply.error)
        elif reply.warning:
            # Stored, but not all of it (metric keys past the run's cap).
            self.warnings += 1
            if self.warnings == 1 or self.warnings % 100 == 0:
                log.warning("link: message %d stored in part (warning %d): %.500s",
                            reply.seq, self.warnings, reply.warning)  # fmt: skip
        with self._lock:
            if reply.seq in self._pending and self._pending.pop(reply.seq) is not None:
                self._in_memory -= 1
            oldest = next(iter(self._pending), self._next_seq)
            self._acked_through = oldest - 1
            if self._spool is not None and time.monotonic() - self._mark_written_at > (
                ACK_MARK_INTERVAL_S
            ):
                self._spool.mark_acked(self._acked_through)
                self._mark_written_at = time.monotonic()
            if not self._pending:
                self._acked_all.notify_all()

    def _command(self, message: dict[str, Any]) -> None:
        handler = self._command_handler
        if handler is None:
            # Expected on a placed run's own link (its robots are the workers'): a console
            # sends to every link of the run until it knows which ones report robots.
            log.debug("link: an operator's command arrived, but this process steps no robot")
            return
        try:
            handler(message)
        except Exception:  # the link's thread must outlive a handler's bug
            log.exception("link: the command handler failed")

    def _refuse(self, why: str, expected: bool = False) -> None:
        if expected:  # e.g. the run ended once the trainer said it finished
            log.info("link to %s closed: %s", self.endpoint, why)
        else:
            log.warning("link to %s refused (%s); training continues without it",
                        self.endpoint, why)  # fmt: skip
        with self._lock:
            self.refused = why
            self._pending.clear()
            self._in_memory = 0
            self._acked_all.notify_all()


class _SpoolReader:
    """Payloads read back from the spool in seq order, in one pass over its file: the
    link asks for them a window at a time, in order, so a new pass starts only for a seq
    the pass has gone by (or, at the end of the file, for one written since)."""

    def __init__(self, spool: Spool) -> None:
        self._spool = spool
        self._lines: Iterator[tuple[int, str]] | None = None
        self._at = 0  # the last seq the pass read

    def payload(self, seq: int) -> str | None:
        """Message `seq`'s payload, or None when the spool does not have it."""
        if self._lines is None or seq <= self._at:
            self._lines = self._spool.messages(after=seq - 1)
        for found, payload in self._lines:
            self._at = found
            if found == seq:
                return payload
            if found > seq:
                return None
        self._lines = None  # the end of the file
        return None
