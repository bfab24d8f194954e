"""`python -m trainer discover` reads a live Ray cluster into an importable section."""

import os
import subprocess
import sys

from trainer import cluster as tc


def discover(address: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainer", "discover", "--address", address],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},
    )  # fmt: skip


def test_it_prints_the_live_cluster_as_a_cluster_section(ray_head):
    result = discover(f"127.0.0.1:{ray_head.ports.gcs}")
    assert result.returncode == 0, result.stderr
    spec = tc.load_cluster_yaml(result.stdout)
    assert spec.num_nodes == 1
    assert spec.nodes[0].accelerators is None  # this machine has no GPU
    # It proposes a placement for the nodes found, which reads as written once uncommented.
    proposed = result.stdout.replace("  # component_placement:", "  component_placement:")
    proposed = proposed.replace("  #   actor:", "    actor:").replace("  #   env:", "    env:")
    placed = tc.load_cluster_yaml(proposed)
    assert placed.component_placement == {"actor": "0", "env": "0"}
    assert len(tc.resolve_placement(placed).components["actor"]) == 1


def test_it_names_an_unreachable_cluster():
    result = discover("127.0.0.1:9")
    assert result.returncode == 2
    assert "cannot connect to Ray at 127.0.0.1:9" in result.stderr
