"""Reading a run's frozen config back: the one reader for every stored config.

`launch.freeze_config` writes it with the trainer's `dump_config` (ruamel, YAML 1.2), so
it is read with the trainer's `parse_yaml`, the same dialect: a YAML 1.1 reader would
take an unquoted `placement: 2:0` for the base-60 number 120.
"""

import io
from typing import Any

from ruamel.yaml import YAML

from controlplane.runs.models import Run
from trainer.config.errors import ConfigError
from trainer.config.loading import parse_yaml

__all__ = ["ConfigError", "dump_value", "frozen_config", "frozen_section"]

_PARSED = "_armature_frozen_config"  # parsed once per Run object: a page reads it often


def frozen_config(run: Run) -> dict[str, Any]:
    """The run's frozen config as a mapping; raises ConfigError (naming what is wrong)
    when the stored text is not a config mapping."""
    parsed = getattr(run, _PARSED, None)
    if parsed is None:
        parsed = parse_yaml(run.config_yaml, f"run {run.pk}'s frozen config")
        if parsed is None:
            parsed = {}
        if not isinstance(parsed, dict):
            raise ConfigError.single("", f"run {run.pk}'s frozen config is not a mapping")
        setattr(run, _PARSED, parsed)
    return parsed


def frozen_section(run: Run, *path: str) -> dict[str, Any]:
    """The mapping at `path` (e.g. "env", "interventions") of the frozen config; {} when
    a level is absent. Raises ConfigError when a level is there but is no mapping."""
    node: Any = frozen_config(run)
    for depth, key in enumerate(path):
        node = node.get(key)
        if node is None:
            return {}
        if not isinstance(node, dict):
            where = ".".join(path[: depth + 1])
            raise ConfigError.single(where, f"not a mapping in run {run.pk}'s frozen config")
    return node


def dump_value(value: Any) -> str:
    """One value of a frozen config as the YAML text it was written as (one line)."""
    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = True
    yaml.width = 10_000
    stream = io.StringIO()
    yaml.dump(value, stream)
    return stream.getvalue().strip().removesuffix("...").strip()
