"""The keys of an experiment config that change what runs on a node, not only what is
computed there: the environment variables and the Python interpreter of the processes
placed through a node group (`cluster.node_groups[*].env_configs[*]`).

Either one is enough to run any command (`PYTHONWARNINGS` or `BROWSER` make any Python
process run a shell command as it starts; an interpreter path is a program), so they
belong to the cluster inventory, which only admins write; the control plane refuses
them in an experiment's own `cluster:` section from anyone else (docs/permissions.md).

Reviewed and left to operators, because they only choose data: `runner.output_dir`
(a run launched by the control plane writes to its own folder, `--output-dir`),
`algorithm.rlpd.demos` (read as arrays, `allow_pickle=False`, never as code),
`env.name` and `env.suite` (names looked up in fixed tables, never imported), robot
addresses and camera serials (data: nothing connects to them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainer.key_paths import KeyPath

PROCESS_SETTINGS = ("env_vars", "python_interpreter_path")


def process_setting_paths(config: Any) -> list[KeyPath]:
    """Key paths of the process-level settings in a raw config mapping (parsed YAML or
    an API payload, before validation), e.g.
    ``("cluster", "node_groups", 0, "env_configs", 1, "env_vars")``. Empty values set
    nothing and are left out; malformed sections are the schema's to report."""
    cluster = config.get("cluster") if isinstance(config, Mapping) else None
    groups = cluster.get("node_groups") if isinstance(cluster, Mapping) else None
    paths = []
    for group_index, group in enumerate(groups if isinstance(groups, list) else []):
        envs = group.get("env_configs") if isinstance(group, Mapping) else None
        for env_index, env in enumerate(envs if isinstance(envs, list) else []):
            if not isinstance(env, Mapping):
                continue
            for key in PROCESS_SETTINGS:
                if env.get(key) not in (None, "", [], {}):
                    paths.append(
                        ("cluster", "node_groups", group_index, "env_configs", env_index, key)
                    )
    return paths
