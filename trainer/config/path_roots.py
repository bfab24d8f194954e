"""The files a config names, kept inside the folders an admin allows.

A run the control plane launches reads (and for `build_tiny` and
`scripted_episodes`, writes) the files its config names on the node it runs on: a
model folder, a checkpoint or run config to start from, demo datasets, a success
classifier. Left free, a config could read any YAML on the node, load any checkpoint or
point a model at another user's files. So for those runs every such path must be
absolute and resolve (links followed) inside one of the roots the control plane allows:
its artifacts folder, its models folder and its datasets folder (`ROOTS_ENV` in the
job's environment). The standalone CLI, the user's own machine, sets none: any path.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from trainer.config.errors import ConfigIssue
from trainer.config.schema import ExperimentConfig
from trainer.key_paths import KeyPath

ROOTS_ENV = "ARMATURE_PATH_ROOTS"  # os.pathsep-separated absolute folders
RULE = "config.path_outside_roots"


def named_paths(config: ExperimentConfig) -> list[tuple[KeyPath, str]]:
    """Every file or folder the config names, with its key path."""
    model, algorithm = config.actor.model, config.algorithm
    classifier = config.env.real_robot.success_classifier
    named: list[tuple[KeyPath, str | None]] = [
        (("actor", "model", "path"), model.path),
        (("actor", "model", "init_from"), model.init_from),
        (("algorithm", "bc", "demos"), algorithm.bc.demos),
        (("algorithm", "rlpd", "demos"), algorithm.rlpd.demos),
        (("env", "real_robot", "success_classifier", "path"),
         classifier.path if classifier is not None else None),
    ]  # fmt: skip
    return [(where, value) for where, value in named if value]


def roots_from_environment() -> list[Path] | None:
    """The roots a control plane gave this job; None when it gave none (the CLI)."""
    value = os.environ.get(ROOTS_ENV)
    if value is None:
        return None
    return [Path(part) for part in value.split(os.pathsep) if part]


def paths_outside(config: ExperimentConfig, roots: Sequence[Path]) -> list[ConfigIssue]:
    """A problem for each path the config names that is not absolute or does not
    resolve inside one of `roots`."""
    real_roots = [Path(os.path.realpath(root)) for root in roots]
    shown = ", ".join(str(root) for root in roots) or "none"
    problems = []
    for where, value in named_paths(config):
        if not os.path.isabs(value):
            problems.append(ConfigIssue(
                RULE, f"{value!r} is relative; a run launched here runs in a job folder of "
                f"its own: give an absolute path inside the allowed folders ({shown})", where,
            ))  # fmt: skip
            continue
        real = Path(os.path.realpath(value))
        if not any(real == root or root in real.parents for root in real_roots):
            problems.append(ConfigIssue(
                RULE, f"{value!r} resolves outside the folders a run launched here may use "
                f"({shown}); an admin sets them (ARMATURE_MODELS_DIR, "
                "ARMATURE_DATASETS_DIR, ARTIFACTS_DIR)", where,
            ))  # fmt: skip
    return problems
