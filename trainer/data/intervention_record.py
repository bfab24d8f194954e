"""The interventions a run records: every transition an operator chose (in the console,
or the scripted test operator), kept in the order they were made with the task each was
made in, and written as a LeRobot dataset in the run's folder (`interventions/`,
`INTERVENTIONS_DIR`) whenever the run saves its buffers. A human's corrections outlive
the run that gathered them: the folder is a demo source like any other
(`algorithm.bc.demos` for SFT, `algorithm.rlpd.demos` for another run) and opens in
LeRobot's own `LeRobotDataset`.

Each stretch of consecutive steps an operator drove on one copy is an episode of the
dataset (`trainer.data.demo_episodes` finds them), its steps together; every frame is
flagged `complementary_info.is_intervention`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainer.data.demos import save_demos
from trainer.data.replay import Batch
from trainer.envs.vision_language import VisionLanguageSpec

INTERVENTIONS_DIR = "interventions"


class InterventionRecord:
    """The intervened rows of every step taken, on the CPU (they are a human's, so few)."""

    def __init__(self) -> None:
        self.parts: list[Batch] = []
        self.task_ids: list[torch.Tensor] = []
        self.rows = 0
        self.written = 0  # rows in the dataset last written
        self.task_id = 0  # the task the steps being added are taken in

    def __len__(self) -> int:
        return self.rows

    def add(self, rows: Batch) -> None:
        """Keep the rows of one step's transitions whose `intervened` flag is set."""
        chosen = rows["intervened"].bool()
        if not bool(chosen.any()):
            return
        picked = {name: tensor[chosen].cpu() for name, tensor in rows.items()}
        count = int(picked["intervened"].shape[0])
        self.parts.append(picked)
        self.task_ids.append(torch.full((count,), self.task_id, dtype=torch.long, device="cpu"))
        self.rows += count

    def transitions(self) -> tuple[Batch, torch.Tensor]:
        """Every recorded row in order, and the task id of each."""
        self._join()
        if not self.parts:
            return {}, torch.zeros(0, dtype=torch.long, device="cpu")
        return self.parts[0], self.task_ids[0]

    def write(
        self,
        folder: Path,
        vision_language: VisionLanguageSpec | None,
        task_name: Callable[[int], str],
        fps: int | None = None,
    ) -> Path | None:
        """Write the dataset at `folder` (replacing the last one) when rows arrived since
        it was written; None when there is nothing new."""
        if self.rows == self.written or self.rows == 0:
            return None
        demos, task_ids = self.transitions()
        names = [task_name(task) for task in range(int(task_ids.max()) + 1)]
        path = save_demos(folder, demos, vision_language, fps, task_ids, names)
        self.written = self.rows
        return path

    def _join(self) -> None:
        """One part per field: the appends of many steps joined once, when read."""
        if len(self.parts) > 1:
            names = self.parts[0]
            self.parts = [{name: torch.cat([part[name] for part in self.parts]) for name in names}]
            self.task_ids = [torch.cat(self.task_ids)]

    def state_dict(self) -> dict[str, Any]:
        demos, task_ids = self.transitions()
        return {"transitions": demos, "task_ids": task_ids}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        demos, task_ids = state["transitions"], state["task_ids"]
        self.parts, self.task_ids = ([demos], [task_ids]) if demos else ([], [])
        self.rows = int(task_ids.shape[0])
        self.written = -1  # the folder may hold later rows than these: written again
