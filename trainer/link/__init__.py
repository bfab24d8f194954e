"""The link from a training run to the control plane: metrics, progress and events out
over a WebSocket, authenticated by the run's token. See docs/link-protocol.md."""

from trainer.link.client import TrainerLink
from trainer.link.environment import Link, NullLink, link_from_env
from trainer.link.reporter import EvalReporter, RunReporter, report_failure

__all__ = [
    "EvalReporter", "Link", "NullLink", "RunReporter", "TrainerLink", "link_from_env",
    "report_failure",
]  # fmt: skip
