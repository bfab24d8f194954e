"""An exported cluster reads back the same in a YAML 1.1 reader (PyYAML's default,
OmegaConf), which takes an unquoted `1:2` for 62 and `yes` or `n` for booleans."""

import yaml

from trainer.cluster import dump_cluster_yaml, load_cluster_yaml

CLUSTER = """cluster:
  num_nodes: 2
  component_placement:
    actor: 0-1
    env: {node_group: n, placement: '0:0-1'}
  node_groups:
    - label: n
      node_ranks: 0-1
      env_configs:
        - node_ranks: 1
          env_vars: [{A: '1:2'}, {B: 'yes'}, {C: plain}, {D: '0x10'}]
"""


def test_a_yaml_1_1_reader_reads_every_exported_string_as_written():
    cluster = load_cluster_yaml(CLUSTER)
    text = dump_cluster_yaml(cluster)
    read = yaml.safe_load(text)["cluster"]  # PyYAML: YAML 1.1
    group = read["node_groups"][0]
    assert group["label"] == "n" and group["node_ranks"] == "0-1"
    assert group["env_configs"][0]["env_vars"] == [
        {"A": "1:2"}, {"B": "yes"}, {"C": "plain"}, {"D": "0x10"}
    ]  # fmt: skip
    assert read["component_placement"]["env"]["placement"] == "0:0-1"
    assert load_cluster_yaml(text) == cluster
