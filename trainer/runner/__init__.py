"""The training loops of one process; ``python -m trainer run`` (trainer.commands.run)
drives them, here or on the ranks of a placement."""

from trainer.runner.on_policy_runner import NothingToResumeError, OnPolicyRunner

__all__ = ["NothingToResumeError", "OnPolicyRunner"]
