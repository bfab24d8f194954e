"""The training loops of one process; ``python -m trainer run`` (trainer.commands.run)
drives them, here or on the ranks of a placement. One loop (loop.py) drives both
families: on-policy (on_policy_runner.py) and RLPD (rlpd_runner.py)."""

from trainer.runner.loop import NothingToResumeError, TrainingLoop
from trainer.runner.on_policy_runner import OnPolicyRunner

__all__ = ["NothingToResumeError", "OnPolicyRunner", "TrainingLoop"]
