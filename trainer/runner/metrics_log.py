"""Metrics on local disk as JSON Lines: one object per iteration, readable with any tool
(``jq``, pandas) and appendable by a resumed run."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


class JsonlMetricsLog:
    def __init__(self, path: Path) -> None:
        self.path = path

    def truncate_after(self, iteration: int) -> None:
        """Drop lines of iterations a resumed run will redo."""
        if not self.path.exists():
            return
        kept = [line for line in self.read() if line["iteration"] <= iteration]
        with self.path.open("w") as handle:
            for record in kept:
                handle.write(json.dumps(record) + "\n")

    def append(self, iteration: int, metrics: dict[str, float]) -> None:
        record: dict[str, Any] = {"iteration": iteration}
        # NaN/inf are not JSON; write them as null rather than breaking readers.
        record.update({k: (v if math.isfinite(v) else None) for k, v in metrics.items()})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line]
