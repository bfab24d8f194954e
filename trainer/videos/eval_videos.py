"""Episode videos of an evaluation (`trainer eval`): the first episodes of each task and
horizon, recorded as a run's are (capture.py, recorder.py), so an eval table's cell
opens the episodes behind its number."""

from __future__ import annotations

from trainer.envs.pictures import pictures_of
from trainer.videos.capture import RoundCapture
from trainer.videos.recorder import EpisodeRecorder


class EvalVideos:
    """Hands out a capture for the first `per_cell` copies of each (task, horizon)'s
    first batch, and gives the recorder their episodes."""

    def __init__(self, env: object, recorder: EpisodeRecorder, per_cell: int, size: int,
                 iteration: int) -> None:  # fmt: skip
        self.pictures = pictures_of(env, size)
        self.recorder, self.per_cell, self.iteration = recorder, per_cell, iteration

    def capture(self, task_id: int, task_name: str, horizon: int, first_state: int,
                count: int) -> RoundCapture | None:  # fmt: skip
        """What to record of a batch of `count` episodes from init states
        `first_state`, `first_state + 1`, ...; None when nothing is to be."""
        if self.pictures is None or first_state:  # the first batch of a cell only
            return None
        copies = list(range(min(count, self.per_cell)))
        info = [{"iteration": self.iteration, "init_state": first_state + copy,
                 "horizon": horizon, "task_name": task_name} for copy in copies]  # fmt: skip

        def name(copy: int) -> str:
            return f"eval-t{task_id}-h{horizon}-s{first_state + copy}"

        return RoundCapture(self.pictures, copies, task_id, info, name)

    def finish(self, capture: RoundCapture) -> None:
        for clip in capture.clips(len(capture.copies)):
            self.recorder.submit(clip)
