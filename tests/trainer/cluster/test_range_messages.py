"""A rank past the end names the node groups the user wrote, whatever the placement names:
the reserved `cluster` (no node_group given) and `node` groups are never in the YAML."""

import pytest

from trainer.cluster import ClusterConfigError, load_cluster_yaml, resolve_placement_text

ONE_MACHINE = """
cluster:
  num_nodes: 1
  node_groups:
    - label: local
      node_ranks: 0
"""


@pytest.mark.parametrize(
    ("placement", "named"),
    [
        ("actor: 0-5", "the whole cluster (node group 'local'), placed without a node_group, "
                       "has 1 node (rank 0)"),
        ("actor: {node_group: node, placement: '0-5'}",
         "the whole cluster (node group 'local'), placed by node, has 1 node (rank 0)"),
        ("actor: {node_group: local, placement: '0-5'}", "node group 'local' has 1 node (rank 0)"),
    ],
)  # fmt: skip
def test_a_rank_past_the_end_names_the_yamls_groups(placement, named):
    with pytest.raises(ClusterConfigError) as raised:
        resolve_placement_text(load_cluster_yaml(ONE_MACHINE), placement)
    (issue,) = raised.value.issues
    assert issue.message.endswith(f"resource rank 5 does not exist: {named}")
    assert "'cluster'" not in issue.message and "'node'" not in issue.message
