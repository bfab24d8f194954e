"""The link's spool: every message of one attempt of a run, on disk, in the run's folder,
with the sequence number up to which the control plane has acknowledged them.

The link writes each message here before sending it, so nothing is lost while the
control plane is unreachable (or when the trainer dies), memory holds only a bounded
window, a restarted trainer of the same attempt continues its numbering, and what is
still unacknowledged when the trainer exits stays here for the control plane to ingest
(`controlplane/runs/spool_ingest.py`). The file format is part of the protocol
(docs/link-protocol.md, "The spool"): `link-spool/attempt-<n>.jsonl`, one message per
line as `<mac> <payload>`, where `<mac>` is the lowercase hex HMAC-SHA256 of the
payload's UTF-8 bytes keyed with the attempt's spool key (`ARMATURE_SPOOL_KEY`), and
`attempt-<n>.acked` holding one integer.

The run folder lies on storage other jobs can write to; the MAC is what tells the
control plane that a line was written by this attempt's trainer and nobody else. The
trainer itself only parses its spool (it wrote it); the control plane verifies it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Iterator
from pathlib import Path

DEFAULT_LIMIT_BYTES = 512 * 2**20
SPOOL_FOLDER = "link-spool"
MAC_HEX_CHARS = 64  # SHA-256, in hex


def spool_files(folder: Path, attempt: int) -> tuple[Path, Path]:
    return folder / f"attempt-{attempt}.jsonl", folder / f"attempt-{attempt}.acked"


def line_mac(key: bytes, payload: bytes) -> bytes:
    """The MAC of one line's payload, as the line carries it (lowercase hex)."""
    return hmac.new(key, payload, hashlib.sha256).hexdigest().encode("ascii")


def spool_line(key: bytes, payload: str) -> bytes:
    """One message as the spool holds it: `<mac> <payload>\\n`."""
    data = payload.encode("utf-8")
    return line_mac(key, data) + b" " + data + b"\n"


def split_line(line: bytes) -> tuple[bytes, bytes] | None:
    """(mac, payload) of one line (its newline already removed); None when the line does
    not have the spool's shape (no MAC, or one of the wrong length)."""
    mac, space, payload = line.partition(b" ")
    if not space or len(mac) != MAC_HEX_CHARS:
        return None
    return mac, payload


def is_authentic(key: bytes, mac: bytes, payload: bytes) -> bool:
    """Whether `mac` is the MAC of `payload` under `key` (a constant-time compare)."""
    return hmac.compare_digest(mac, line_mac(key, payload))


def payload_seq(payload: str) -> int | None:
    """The message's seq when the payload is a JSON object with a whole-number seq, else
    None. Never raises: a spool line may be anything (cut short by a crash, or worse)."""
    try:
        data = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    seq = data.get("seq") if isinstance(data, dict) else None
    return seq if type(seq) is int else None


class Spool:
    def __init__(
        self, folder: Path, attempt: int, key: str, limit_bytes: int = DEFAULT_LIMIT_BYTES
    ):
        """`key`: the attempt's spool key, which every line is signed with."""
        folder.mkdir(parents=True, exist_ok=True)
        self.path, self.acked_path = spool_files(folder, attempt)
        self.limit_bytes = limit_bytes
        self._key = key.encode("utf-8")
        self._file = self.path.open("ab")
        self.size = self.path.stat().st_size

    def append(self, payload: str) -> bool:
        """Write one message; False (nothing written) when the spool is full."""
        line = spool_line(self._key, payload)
        if self.size + len(line) > self.limit_bytes:
            return False
        self._file.write(line)
        self._file.flush()  # into the OS: a trainer that crashes leaves it behind
        self.size += len(line)
        return True

    def messages(self, after: int = 0) -> Iterator[tuple[int, str]]:
        """(seq, payload) of the spooled messages with seq > `after`, in order; a line
        that cannot be read as one (cut short by a crash) is passed over."""
        self._file.flush()
        with self.path.open("rb") as handle:
            for line in handle:
                parts = split_line(line.rstrip(b"\n"))
                try:
                    payload = parts[1].decode("utf-8") if parts else ""
                except UnicodeDecodeError:
                    continue
                seq = payload_seq(payload)
                if seq is not None and seq > after:
                    yield seq, payload

    def last_seq(self) -> int:
        return max((seq for seq, _ in self.messages()), default=0)

    def acked_through(self) -> int:
        try:
            return int(self.acked_path.read_text())
        except (OSError, ValueError):
            return 0

    def mark_acked(self, through: int) -> None:
        partial = self.acked_path.with_suffix(".partial")
        partial.write_text(str(through))
        os.replace(partial, self.acked_path)

    def close(self) -> None:
        self._file.close()

    def remove(self) -> None:
        """Everything was acknowledged: the spool has nothing left to give."""
        self.close()
        for path in (self.path, self.acked_path):
            path.unlink(missing_ok=True)
