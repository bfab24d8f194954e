"""The link's spool: every message of one attempt of a run, on disk, in the run's folder,
with the sequence number up to which the control plane has acknowledged them.

The link writes each message here before sending it, so nothing is lost while the
control plane is unreachable (or when the trainer dies), memory holds only a bounded
window, a restarted trainer of the same attempt continues its numbering, and what is
still unacknowledged when the trainer exits stays here for the control plane to ingest
(`controlplane/runs/spool_ingest.py`). The file format is part of the protocol:
`link-spool/attempt-<n>.jsonl`, one message per line exactly as sent, and
`attempt-<n>.acked` holding one integer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

DEFAULT_LIMIT_BYTES = 512 * 2**20
SPOOL_FOLDER = "link-spool"


def spool_files(folder: Path, attempt: int) -> tuple[Path, Path]:
    return folder / f"attempt-{attempt}.jsonl", folder / f"attempt-{attempt}.acked"


class Spool:
    def __init__(self, folder: Path, attempt: int, limit_bytes: int = DEFAULT_LIMIT_BYTES):
        folder.mkdir(parents=True, exist_ok=True)
        self.path, self.acked_path = spool_files(folder, attempt)
        self.limit_bytes = limit_bytes
        self._file = self.path.open("a", encoding="utf-8")
        self.size = self.path.stat().st_size

    def append(self, payload: str) -> bool:
        """Write one message; False (nothing written) when the spool is full."""
        line = payload + "\n"
        if self.size + len(line) > self.limit_bytes:
            return False
        self._file.write(line)
        self._file.flush()  # into the OS: a trainer that crashes leaves it behind
        self.size += len(line)
        return True

    def messages(self, after: int = 0) -> Iterator[tuple[int, str]]:
        """(seq, payload) of the spooled messages with seq > `after`, in order."""
        self._file.flush()
        with self.path.open(encoding="utf-8") as handle:
            for line in handle:
                payload = line.rstrip("\n")
                try:
                    seq = json.loads(payload)["seq"]
                except (ValueError, KeyError, TypeError):
                    continue  # a line cut short by a crash
                if seq > after:
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
