"""Where a process of a run is: what the run page shows next to the placement plan."""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class ProcessReport:
    component: str
    rank: int
    node_rank: int
    node_ip: str
    pid: int
    visible_devices: str | None  # the accelerators the process sees (None: not restricted)
    interpreter: str
    device: str | None = None  # what it computes on (trainer.devices.describe_device)

    @classmethod
    def here(
        cls,
        component: str,
        rank: int,
        node_rank: int,
        node_ip: str | None = None,
        device: str | None = None,
    ) -> ProcessReport:
        return cls(
            component=component,
            rank=rank,
            node_rank=node_rank,
            node_ip=node_ip or _this_host(),
            pid=os.getpid(),
            visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
            interpreter=sys.executable,
            device=device,
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _this_host() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"
