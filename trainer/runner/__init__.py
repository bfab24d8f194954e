"""The standalone single-process runner; its ``run`` command is ``trainer.runner.cli``."""

from trainer.runner.on_policy_runner import NothingToResumeError, OnPolicyRunner

__all__ = ["NothingToResumeError", "OnPolicyRunner"]
