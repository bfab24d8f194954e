"""Taking in what a trainer left in its link spool: the messages the control plane never
acknowledged (it was unreachable when the trainer exited, or the trainer died).

Reconciliation calls this once a run's job has ended, before it maps Ray's status onto
the run, so the trainer's own last words (`finished` with its summary, `failed` with its
error) decide the run's end even when they never made it over the link. Every message
goes through the same validation and idempotent storage as the live link, in batches.

The spool lies in the run's folder, on storage other jobs can write to, so no line is
taken on trust (docs/link-protocol.md, "The spool"): each must carry the MAC of its
attempt's spool key, be UTF-8, fit the protocol's size, and be a valid message. Any
other line is passed over and counted on the run (`Run.link_rejected`), and each pass
that refused lines leaves one `spool_refused` event saying how many and why. Nothing a
line holds can stop a pass: it always reaches the end of the file (or its time budget).

A pass is resumable and exclusive: it notes the byte offset it has stored up to
(`attempt-<n>.ingested`) after each batch, so the next pass goes on from there, and
only one pass at a time works on a run (the others skip it).
"""

import fcntl
import logging
import os
import re
import stat
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from django.conf import settings
from django.db import DatabaseError, DataError, IntegrityError, connection, transaction

from controlplane.runs import telemetry
from controlplane.runs.artifacts import ArtifactNotFound, open_beneath, run_folder
from controlplane.runs.models import Run, RunEvent
from controlplane.runs.tokens import make_spool_key
from trainer.link.protocol import MAX_MESSAGE_CHARS, InvalidMessage
from trainer.link.spool import MAC_HEX_CHARS, SPOOL_FOLDER, is_authentic, split_line

log = logging.getLogger(__name__)

_SPOOL_FILE = re.compile(r"attempt-(\d{1,9})\.jsonl")
# The longest line an honest trainer writes: a MAC, a space, and a message of the most
# characters the protocol takes, each at most 4 bytes of UTF-8.
MAX_LINE_BYTES = MAC_HEX_CHARS + 1 + 4 * MAX_MESSAGE_CHARS
# Messages stored per batch (one `record_many` call, one transaction); progress is noted
# after each batch, and after every NOTE_EVERY_BYTES read however few lines were valid.
BATCH_MESSAGES = 1000
NOTE_EVERY_BYTES = 8 * 2**20
# A pass stops after this many seconds, its progress noted, and the next pass goes on:
# well within the reconcile task's soft time limit (runs.tasks.LIMITS, 120 s).
PASS_BUDGET_S = 90.0
# Why a line is refused, as the `spool_refused` event counts them.
REASONS = {
    "unsigned": "not `<mac> <payload>`",
    "foreign": "not signed with this attempt's spool key",
    "too_long": f"longer than {MAX_LINE_BYTES} bytes",
    "cut_short": "cut short (no newline at the end of the file)",
    "not_utf8": "not UTF-8",
    "invalid": "not a valid message",
    "not_storable": "refused by the database",
}
_LOCK_SPACE = 0x5350 << 40  # PostgreSQL advisory lock keys of this module: this + run id
_READ_CHUNK = 1 << 20


@dataclass
class IngestReport:
    """What one pass did: messages newly stored, lines refused (by reason), and whether
    every spool of the run is done (False: another pass holds the run, or this one ran
    out of its budget; the next reconciliation goes on)."""

    stored: int = 0
    refused: Counter = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)
    done: bool = True
    skipped: bool = False  # another pass was working on the run

    def refuse(self, reason: str, example: str = "") -> None:
        self.refused[reason] += 1
        if example and reason not in self.examples:
            self.examples[reason] = example[:300]


def has_spool(run_id: int) -> bool:
    try:
        with _spool_folder(run_id) as folder:
            return bool(_spool_attempts(folder))
    except ArtifactNotFound:
        return False


def ingest_spools(run: Run, budget_s: float = PASS_BUDGET_S) -> IngestReport:
    """Store every unacknowledged message of every attempt's spool, oldest attempt first,
    then remove each spool taken in completely."""
    deadline = time.monotonic() + budget_s
    with _one_pass_at_a_time(run.pk) as held:
        if not held:
            return IngestReport(done=False, skipped=True)
        report = IngestReport()
        try:
            with _spool_folder(run.pk) as folder:
                for attempt, name in _spool_attempts(folder):
                    if not _ingest_file(run, folder, attempt, name, report, deadline):
                        report.done = False
                        break
        except ArtifactNotFound:
            pass
        _report_refused(run.pk, report)
    if report.stored:
        log.info("run %s: took in %d messages from its link spool", run.pk, report.stored)
    return report


# --- One spool file ------------------------------------------------------------------


def _ingest_file(
    run: Run, folder: int, attempt: int, name: str, report: IngestReport, deadline: float
) -> bool:
    """Take in one attempt's spool from where the last pass stopped; True once it is
    all taken in and removed, False when the budget ran out first."""
    mark = name.removesuffix(".jsonl") + ".ingested"
    try:
        handle = _open_regular(folder, name)
    except ArtifactNotFound:  # gone, or a link, a FIFO…: no trainer wrote that
        log.warning("run %s: %s in its link spool is not a regular file", run.pk, name)
        _remove(folder, [name], run.pk)
        return True
    key = make_spool_key(run.pk, attempt).encode()
    acked = _read_int(folder, name.removesuffix(".jsonl") + ".acked")
    batch = _Batch(run.pk, attempt, moves_state=attempt == run.attempt, report=report)
    with handle:
        noted = _read_int(folder, mark)
        size = os.fstat(handle.fileno()).st_size
        if noted > size:  # the mark of another file
            noted = 0
        handle.seek(noted)
        for end, line in _lines(handle, size):
            message = _message(line, key, report)
            if message is not None and message["seq"] > acked:
                batch.add(message)
            if batch.full() or end - noted >= NOTE_EVERY_BYTES:
                batch.store()
                _note_progress(folder, mark, end)
                noted = end
                if time.monotonic() > deadline:
                    return False
        batch.store()
    stem = name.removesuffix(".jsonl")
    _remove(folder, [name, stem + ".acked", stem + ".ingested"], run.pk)
    return True


def _remove(folder: int, names: list[str], run_id: int) -> None:
    """Remove entries of the spool folder (a link itself, never what it points at)."""
    for name in names:
        try:
            os.unlink(name, dir_fd=folder)
        except FileNotFoundError:
            pass
        except OSError as error:  # taken in all the same; the next pass finds it stored
            log.warning("run %s: cannot remove %s from its link spool: %s", run_id, name, error)


def _message(line: bytes | None, key: bytes, report: IngestReport) -> dict[str, Any] | None:
    """The valid message one line holds, or None with the line's refusal noted."""
    if line is None:
        report.refuse("too_long")
        return None
    if not line.endswith(b"\n"):
        report.refuse("cut_short")
        return None
    parts = split_line(line[:-1])
    if parts is None:
        report.refuse("unsigned")
        return None
    mac, payload = parts
    if not is_authentic(key, mac, payload):
        report.refuse("foreign")
        return None
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        report.refuse("not_utf8")
        return None
    try:
        return telemetry.parse_message(text)
    except InvalidMessage as invalid:
        report.refuse("invalid", invalid.error)
    except RecursionError:  # nesting deeper than the parser goes
        report.refuse("invalid", "nested too deeply")
    return None


def _lines(handle: BinaryIO, size: int) -> Iterator[tuple[int, bytes | None]]:
    """(offset after the line, the line with its newline) for each line from the current
    position up to `size` (the file's size when the pass began: what is written later
    was not written by the trainer, whose job has ended); None for a line longer than
    MAX_LINE_BYTES, which is read past in chunks, never held whole."""
    offset = handle.tell()
    while offset < size and (line := handle.readline(min(MAX_LINE_BYTES + 1, size - offset))):
        offset += len(line)
        if len(line) <= MAX_LINE_BYTES or line.endswith(b"\n"):
            yield offset, line
            continue
        while offset < size and (rest := handle.readline(min(_READ_CHUNK, size - offset))):
            offset += len(rest)
            if rest.endswith(b"\n"):
                break
        yield offset, None


class _Batch:
    """Valid messages of one attempt waiting to be stored together."""

    def __init__(self, run_id: int, attempt: int, moves_state: bool, report: IngestReport):
        self.run_id, self.attempt, self.moves_state = run_id, attempt, moves_state
        self.report = report
        self.messages: list[dict[str, Any]] = []
        self.known_keys: dict[str, int] = {}
        self.counted = sum(report.refused.values())

    def add(self, message: dict[str, Any]) -> None:
        self.messages.append(message)

    def full(self) -> bool:
        return len(self.messages) >= BATCH_MESSAGES

    def store(self) -> None:
        """Store the batch, and count the lines refused since the last one on the run.

        Metrics first, then the rest (progress, events) in order, all in one call of
        `record_many`: one transaction whose points go in one COPY, and a state change
        comes after the points before it. An earlier attempt's events do not move the
        run. A database that is down or locked raises: the pass stops, and the next goes
        on from the last noted offset."""
        metrics = [m for m in self.messages if m["type"] == "metrics"]
        self._record(metrics + [m for m in self.messages if m["type"] != "metrics"])
        self.messages = []
        refused = sum(self.report.refused.values())
        if refused > self.counted:
            telemetry.count_rejected(self.run_id, refused - self.counted)
            self.counted = refused

    def _record(self, messages: list[dict[str, Any]]) -> None:
        if not messages:
            return
        try:
            new = telemetry.record_many(
                self.run_id, messages, self.attempt, self.moves_state, self.known_keys
            )
        except (DataError, IntegrityError):  # one message's text or number, say
            new = self._one_at_a_time(messages)
        self.report.stored += sum(new)

    def _one_at_a_time(self, messages: list[dict[str, Any]]) -> list[bool]:
        """The messages again, each on its own, so the one the database refuses is
        refused alone."""
        self.known_keys.clear()  # rows of a rolled-back transaction may be in it
        new = []
        for message in messages:
            try:
                with transaction.atomic():
                    new += telemetry.record_many(
                        self.run_id, [message], self.attempt, self.moves_state
                    )
            except (DataError, IntegrityError) as error:
                self.report.refuse("not_storable", f"seq {message['seq']}: {error}")
        return new


# --- The run's spool folder, read without trusting it --------------------------------


@contextmanager
def _spool_folder(run_id: int) -> Iterator[int]:
    """A descriptor of the run's link-spool folder (no link followed on the way)."""
    with run_folder(run_id) as folder:
        spool = open_beneath(folder, SPOOL_FOLDER, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield spool
    finally:
        os.close(spool)


def _spool_attempts(folder: int) -> list[tuple[int, str]]:
    """(attempt, file name) of the folder's spools, oldest attempt first; none when the
    folder cannot be listed (a run must not wait on a folder it can never read)."""
    try:
        names = os.listdir(folder)
    except OSError as error:
        log.warning("cannot list a link spool folder: %s", error)
        return []
    found = [(int(m.group(1)), name) for name in names if (m := _SPOOL_FILE.fullmatch(name))]
    return sorted(found)


def _open_regular(folder: int, name: str) -> BinaryIO:
    descriptor = open_beneath(folder, name)
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):  # a FIFO or a device never ends
        os.close(descriptor)
        raise ArtifactNotFound(name)
    os.set_blocking(descriptor, True)
    return os.fdopen(descriptor, "rb")


def _read_int(folder: int, name: str) -> int:
    """A mark file's integer; 0 when it is missing or not one."""
    try:
        with _open_regular(folder, name) as handle:
            return max(0, int(handle.read(32)))
    except (ArtifactNotFound, ValueError):
        return 0


def _note_progress(folder: int, name: str, offset: int) -> None:
    """Write the mark of how far the spool is stored; without it (a folder the control
    plane cannot write) the next pass starts over, which stores nothing twice."""
    partial = name + ".partial"
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        descriptor = os.open(partial, flags, 0o644, dir_fd=folder)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(str(offset))
        os.replace(partial, name, src_dir_fd=folder, dst_dir_fd=folder)
    except OSError as error:
        log.warning("spool progress not noted in %s: %s", name, error)


# --- One pass at a time per run ------------------------------------------------------


@contextmanager
def _one_pass_at_a_time(run_id: int) -> Iterator[bool]:
    """Whether this pass may work on the run: True while no other pass holds it (in any
    process). PostgreSQL: a session advisory lock, released at the end or with the
    connection; SQLite (one machine): a file lock in the var folder."""
    if connection.vendor == "postgresql":
        with _advisory_lock(_LOCK_SPACE + run_id) as held:
            yield held
    else:
        with _file_lock(settings.VAR_DIR / "locks" / f"spool-ingest-run-{run_id}.lock") as held:
            yield held


@contextmanager
def _advisory_lock(key: int) -> Iterator[bool]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [key])
        held = cursor.fetchone()[0]
    try:
        yield held
    finally:
        if held:
            try:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_advisory_unlock(%s)", [key])
            except DatabaseError:  # a broken connection: closing it releases the lock
                connection.close()


@contextmanager
def _file_lock(path) -> Iterator[bool]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True  # closing the file releases the lock


# --- Telling the run what was refused --------------------------------------------------


def _report_refused(run_id: int, report: IngestReport) -> None:
    """One `spool_refused` event for the pass (the count is on the run already)."""
    total = sum(report.refused.values())
    if not total:
        return
    why = ", ".join(f"{n} {REASONS[reason]}" for reason, n in report.refused.most_common())
    message = f"link spool: {total} lines refused ({why})"
    log.warning("run %s: %s", run_id, message)
    RunEvent.objects.create(
        run_id=run_id,
        kind="spool_refused",
        message=message,
        data={"refused": dict(report.refused), "examples": report.examples},
    )
