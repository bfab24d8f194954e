"""The episode videos of a training run (`runner.videos`): in its first iteration and
every `every`-th, up to `per_task` of the iteration's episodes, failures and successes
in turn, recorded by the copies' rounds (capture.py) and encoded off the loop
(recorder.py). On-policy runs and one-process RLPD runs use it alike."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer.config.schema import VideosConfig
from trainer.envs.pictures import Pictures, pictures_of
from trainer.videos.capture import RoundCapture
from trainer.videos.recorder import EpisodeRecorder, can_record

log = logging.getLogger(__name__)


class RunVideos:
    def __init__(
        self, settings: VideosConfig, pictures: Pictures, recorder: EpisodeRecorder
    ) -> None:
        self.settings, self.pictures, self.recorder = settings, pictures, recorder
        self.recorded_this_iteration = 0

    @classmethod
    def of(
        cls, settings: VideosConfig, env: object, output_dir: Path,
        on_video: Callable[[dict[str, Any]], None] | None,
    ) -> RunVideos | None:  # fmt: skip
        """The run's videos, or None when it records none (none asked for, no PyAV, or
        an env without pictures)."""
        if not settings.every or not can_record():
            return None
        pictures = pictures_of(env, settings.size)
        if pictures is None:
            log.info("runner.videos: this env gives no pictures; no videos are recorded")
            return None
        recorder = EpisodeRecorder(
            output_dir / "videos", settings.fps, settings.max_mb * 2**20, on_episode=on_video
        )
        return cls(settings, pictures, recorder)

    def new_iteration(self) -> None:
        self.recorded_this_iteration = 0

    def capture(
        self, iteration: int, task_id: int, task_name: str, init_states: list[int],
        horizons: list[int] | None, held: int, name: Callable[[int], str],
    ) -> RoundCapture | None:  # fmt: skip
        """What of a round of iteration `iteration` (1-based) to record: its first copies
        (of the first `held`), while the iteration still wants episodes. `name(copy)`:
        each episode's file stem."""
        wanted = self.settings.per_task - self.recorded_this_iteration
        if (iteration - 1) % self.settings.every or wanted <= 0:
            return None
        copies = list(range(min(held, 2 * wanted)))
        info = [
            {"iteration": iteration, "init_state": init_states[copy], "task_name": task_name,
             **({"horizon": horizons[copy]} if horizons is not None else {})}
            for copy in copies
        ]  # fmt: skip
        return RoundCapture(self.pictures, copies, task_id, info, name)

    def finish(self, capture: RoundCapture) -> None:
        """Queue the round's chosen episodes (dropped, and counted, when the encoder is
        behind)."""
        wanted = self.settings.per_task - self.recorded_this_iteration
        for clip in capture.clips(wanted):
            self.recorder.submit(clip)
            self.recorded_this_iteration += 1

    def close(self) -> None:
        """Finish the videos queued."""
        stats = self.recorder.close()
        if stats.dropped or stats.failed:
            log.warning(
                "episode videos: %d recorded, %d dropped (the encoder fell behind), %d failed",
                stats.recorded, stats.dropped, stats.failed,
            )  # fmt: skip
