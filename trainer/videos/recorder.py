"""Episode videos, encoded off the rollout's loop.

A rollout hands each recorded episode over whole (`EpisodeClip`: its frames and what
it knows: task, init state, horizon, iteration, outcome, who acted at each step, the
rewards). One thread encodes them to H.264 mp4 (PyAV) in `<run>/videos/`, appends the
episode's record to `<run>/videos/index.jsonl` and tells `on_episode` (the trainer
link's `episode` event). The queue between them is bounded: when encoding falls behind,
a new episode is dropped whole and counted, and the rollout never waits.

Within the run's disk budget (`max_bytes`), the first and the newest episodes of each
task are kept and the middle ones are thinned: a thinned episode's file is deleted and
a line `{"name": ..., "thinned": true}` follows its record in the index (the last line
of a name is what holds)."""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

INDEX = "index.jsonl"
# Who acted at a step, as the console's episode timeline says it.
ACTORS = ("policy", "human", "held")


@dataclass
class EpisodeClip:
    """One episode to record. `frames`: [T, H, W, 3] uint8 (each frame the picture
    after a step, the first the reset's); `actors` and `rewards`: one per step."""

    name: str  # the file's stem: letters, digits, _ and - only
    task: int
    frames: np.ndarray
    actors: list[str]
    rewards: list[float]
    success: bool
    info: dict[str, Any] = field(default_factory=dict)  # init_state, horizon, iteration…

    def record(self, size_bytes: int) -> dict[str, Any]:
        return {
            "name": self.name,
            "file": f"{self.name}.mp4",
            "task": self.task,
            "success": bool(self.success),
            "return": float(sum(self.rewards)),
            "length": len(self.actors),
            "actors": list(self.actors),
            "rewards": [round(float(r), 6) for r in self.rewards],
            "human_steps": sum(actor == "human" for actor in self.actors),
            "bytes": size_bytes,
            **self.info,
        }


@dataclass
class RecorderStats:
    recorded: int = 0
    dropped: int = 0  # fell behind: dropped whole, never recorded
    failed: int = 0  # could not be encoded or written
    thinned: int = 0  # recorded, then deleted to stay within the budget
    bytes: int = 0  # on disk now


def can_record() -> bool:
    """Whether PyAV is here (a bare GPU machine's environment may lack it): a run that
    asks for videos without it records none, and says so."""
    try:
        import av  # noqa: F401 - imported when a run records, not before
    except ImportError:
        log.warning("runner.videos: PyAV is not installed here; no episode videos are recorded")
        return False
    return True


class EpisodeRecorder:
    """Encodes submitted episodes on a thread of its own; `close` waits for those
    already queued."""

    def __init__(
        self,
        folder: Path,
        fps: int = 10,
        max_bytes: int = 200 * 2**20,
        queue_size: int = 8,
        on_episode: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        if fps < 1 or max_bytes < 1 or queue_size < 1:
            raise ValueError("fps, max_bytes and queue_size must be positive")

        self.folder = folder
        self.fps = fps
        self.max_bytes = max_bytes
        self.on_episode = on_episode
        self.stats = RecorderStats()
        self._queue: queue.Queue[EpisodeClip | None] = queue.Queue(maxsize=queue_size)
        self._kept: dict[int, list[tuple[str, int]]] = defaultdict(list)  # task → (name, bytes)
        self._lock = threading.Lock()
        folder.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._work, name="episode-recorder", daemon=True)
        self._thread.start()

    def submit(self, clip: EpisodeClip) -> bool:
        """Queue `clip`; False (and counted) when the queue is full: never blocks."""
        if not clip.name or not all(c.isalnum() or c in "_-" for c in clip.name):
            raise ValueError(f"episode name {clip.name!r}: letters, digits, _ and - only")
        try:
            self._queue.put_nowait(clip)
        except queue.Full:
            with self._lock:
                self.stats.dropped += 1
            return False
        return True

    def close(self, timeout: float | None = 60.0) -> RecorderStats:
        """Encode what is queued, then stop."""
        self._queue.put(None)
        self._thread.join(timeout)
        return self.stats

    # ----- the encoding thread -----------------------------------------------------
    def _work(self) -> None:
        while (clip := self._queue.get()) is not None:
            try:
                size = encode_mp4(self.folder / f"{clip.name}.mp4", clip.frames, self.fps)
            except Exception:  # a bad frame must not end the recording of the others
                log.exception("could not record episode %s", clip.name)
                with self._lock:
                    self.stats.failed += 1
                continue
            record = clip.record(size)
            self._append(record)
            with self._lock:
                self.stats.recorded += 1
                self.stats.bytes += size
            self._kept[clip.task].append((clip.name, size))
            self._thin()
            if self.on_episode is not None:
                try:
                    self.on_episode(record)
                except Exception:
                    log.exception("could not report episode %s", clip.name)

    def _append(self, record: dict[str, Any]) -> None:
        with (self.folder / INDEX).open("a", encoding="utf-8") as index:
            index.write(json.dumps(record, separators=(",", ":")) + "\n")

    def _thin(self) -> None:
        """Past the budget, delete middle episodes (never a task's first or newest) of
        the task that keeps the most, until within it or nothing is left to thin."""
        while self.stats.bytes > self.max_bytes:
            task, kept = max(self._kept.items(), key=lambda item: len(item[1]))
            if len(kept) <= 2:
                return
            name, size = kept.pop(len(kept) // 2)
            (self.folder / f"{name}.mp4").unlink(missing_ok=True)
            self._append({"name": name, "thinned": True})
            with self._lock:
                self.stats.thinned += 1
                self.stats.bytes -= size


def encode_mp4(path: Path, frames: np.ndarray, fps: int) -> int:
    """Write `frames` ([T, H, W, 3] uint8) to `path` as H.264 mp4 (yuv420p, so odd
    sizes lose their last row or column); its size in bytes. Written to a temporary
    name first: a reader never meets half a file."""
    import av  # the trainer imports PyAV only when it records

    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"frames must be [T, H, W, 3] uint8, not {frames.shape} {frames.dtype}")
    height, width = frames.shape[1] // 2 * 2, frames.shape[2] // 2 * 2
    if not len(frames) or height < 2 or width < 2:
        raise ValueError(f"no picture to encode in frames of shape {frames.shape}")
    partial = path.with_suffix(".mp4.part")
    with av.open(str(partial), "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "veryfast", "crf": "28"}
        for frame in frames:
            picture = av.VideoFrame.from_ndarray(
                np.ascontiguousarray(frame[:height, :width]), format="rgb24"
            )
            container.mux(stream.encode(picture))
        container.mux(stream.encode())
    partial.replace(path)
    return path.stat().st_size


def read_index(folder: Path) -> list[dict[str, Any]]:
    """The episodes the index holds, in the order recorded, as their last line says
    (a thinned one: `{"name", "thinned": true}` over its record); lines that are not a
    record (a crash mid-line) are skipped."""
    latest: dict[str, dict[str, Any]] = {}
    path = folder / INDEX
    if not path.exists():
        return []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(row, dict) or not isinstance(row.get("name"), str):
            continue
        if row.get("thinned") and row["name"] in latest:
            latest[row["name"]] = {**latest[row["name"]], "thinned": True}
        else:
            latest[row["name"]] = row
    return list(latest.values())
