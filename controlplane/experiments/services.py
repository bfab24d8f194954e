"""Experiments and their revisions. Every config is validated by the trainer's own
schema before it is stored; a revision is never changed once written."""

import difflib

from django.db import transaction

from controlplane.access.process_settings import refuse_process_settings
from controlplane.experiments.models import Experiment, Revision
from trainer.config.errors import ConfigError
from trainer.config.loading import parse_yaml, validate_config


def validate_config_yaml(text: str, author=None) -> None:
    """Raise `trainer.config.errors.ConfigError` (every problem with its key path): the
    schema's, and process-level settings that `author` may not save."""
    data = parse_yaml(text)
    problems = []
    for check in (lambda: validate_config(data),
                  lambda: refuse_process_settings(author, data, "saved")):  # fmt: skip
        try:
            check()
        except ConfigError as error:
            problems += error.problems
    if problems:
        raise ConfigError(problems)


@transaction.atomic
def create_experiment(
    name: str, config_yaml: str, *, description: str = "", tags: list[str] | None = None,
    author=None,
) -> Experiment:  # fmt: skip
    validate_config_yaml(config_yaml, author)
    experiment = Experiment.objects.create(
        name=name, description=description, tags=tags or [], created_by=author
    )
    Revision.objects.create(
        experiment=experiment, number=1, config_yaml=config_yaml, author=author,
        message="created",
    )  # fmt: skip
    return experiment


@transaction.atomic
def save_revision(
    experiment: Experiment, config_yaml: str, *, author=None, message: str = ""
) -> Revision:
    """A new revision when the config changed; the latest one when it did not."""
    validate_config_yaml(config_yaml, author)
    locked = Experiment.objects.select_for_update().get(pk=experiment.pk)
    latest = locked.latest_revision
    if latest is not None and latest.config_yaml == config_yaml:
        return latest
    revision = Revision.objects.create(
        experiment=locked,
        number=(latest.number if latest else 0) + 1,
        config_yaml=config_yaml,
        author=author,
        message=message,
    )
    locked.save(update_fields=["updated_at"])
    return revision


def update_details(experiment: Experiment, *, description: str, tags: list[str]) -> Experiment:
    experiment.description = description
    experiment.tags = tags
    experiment.save(update_fields=["description", "tags", "updated_at"])
    return experiment


def clone_experiment(source: Experiment, name: str, *, author=None) -> Experiment:
    latest = source.latest_revision
    return create_experiment(
        name, latest.config_yaml, description=source.description, tags=list(source.tags),
        author=author,
    )  # fmt: skip


def config_diff(old: str, new: str, old_label: str, new_label: str) -> list[str]:
    """Unified diff lines between two configs."""
    return list(
        difflib.unified_diff(old.splitlines(), new.splitlines(), old_label, new_label, lineterm="")
    )
