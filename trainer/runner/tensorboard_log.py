"""The run's metrics as TensorBoard event files in ``<output_dir>/tensorboard/``, so
``tensorboard --logdir <run folder>`` shows a run without the control plane."""

from __future__ import annotations

import logging
import math
from pathlib import Path

TENSORBOARD_FOLDER = "tensorboard"
log = logging.getLogger(__name__)


class TensorBoardLog:
    """One scalar per metric per iteration. A resumed run purges the iterations after
    its checkpoint, so TensorBoard shows the redone ones once."""

    def __init__(self, output_dir: Path, resume_from: int = 0) -> None:
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        self.folder = Path(output_dir) / TENSORBOARD_FOLDER
        self.writer = SummaryWriter(
            str(self.folder), purge_step=resume_from + 1 if resume_from else None
        )

    @classmethod
    def open(cls, output_dir: Path, resume_from: int = 0) -> TensorBoardLog | None:
        """The run's TensorBoard log, or None where TensorBoard is not installed (a bare
        CUDA machine running the GPU check, say): the log says so once, and
        metrics.jsonl still holds every metric."""
        try:
            return cls(output_dir, resume_from)
        except ImportError as error:
            log.warning("no %s/ folder for this run: %s (metrics.jsonl holds every metric)",
                        TENSORBOARD_FOLDER, error)  # fmt: skip
            return None

    def append(self, iteration: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            if math.isfinite(value):  # TensorBoard would chart NaN/inf as gaps anyway
                self.writer.add_scalar(key, value, global_step=iteration)
        # Flushed every iteration: people watch a live run's folder.
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
