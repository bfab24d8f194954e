"""Who may put process-level settings (environment variables, interpreter: see
`trainer.config.process_settings`) into an experiment's config: the rule of the
`config-process-settings` part in the access table, admins only. Everyone else keeps
them in the cluster inventory, which admins write, and launches with that cluster."""

from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

from controlplane.access.doors import SEE, verdict
from trainer.config.errors import ConfigError, ConfigIssue
from trainer.config.process_settings import process_setting_paths

PART = "config-process-settings"


def refuse_process_settings(
    user: AbstractBaseUser | AnonymousUser | None, config: Any, doing: str
) -> None:
    """Raise ConfigError naming each process-level key of `config` (raw parsed data)
    unless `user` may set them. `doing` says what was refused ("saved", "launched").
    `user=None` is the application itself (the first start's demo experiments)."""
    if user is None:
        return
    paths = process_setting_paths(config)
    if not paths:
        return
    decision = verdict(user, PART, SEE)
    if decision.allowed:
        return
    message = (
        f"process-level settings cannot be {doing} in an experiment by you: "
        f"{decision.reason} Ask an admin to put them in a cluster of the inventory and "
        "launch with that cluster."
    )
    raise ConfigError([ConfigIssue(PART, message, path) for path in paths])
