"""The run's metrics as TensorBoard event files in ``<output_dir>/tensorboard/``, so
``tensorboard --logdir <run folder>`` shows a run without the control plane."""

from __future__ import annotations

import math
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

TENSORBOARD_FOLDER = "tensorboard"


class TensorBoardLog:
    """One scalar per metric per iteration. A resumed run purges the iterations after
    its checkpoint, so TensorBoard shows the redone ones once."""

    def __init__(self, output_dir: Path, resume_from: int = 0) -> None:
        self.folder = Path(output_dir) / TENSORBOARD_FOLDER
        self.writer = SummaryWriter(
            str(self.folder), purge_step=resume_from + 1 if resume_from else None
        )

    def append(self, iteration: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            if math.isfinite(value):  # TensorBoard would chart NaN/inf as gaps anyway
                self.writer.add_scalar(key, value, global_step=iteration)
        # Flushed every iteration: people watch a live run's folder.
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
