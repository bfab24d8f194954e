"""Real arms stepped by placed env workers: an RLPD run whose acting workers sit on two
Ray nodes, one of them the arms' robot node, each worker driving the arm of its own env
copy behind a fake SERL robot server, every pose inside the arm's safety box."""

import pytest
import yaml

from tests.ray_cluster import labelled_ray_cluster
from tests.trainer.envs.test_real_robot import BOX, robots
from tests.trainer.hardware.fake_serl_server import fake_servers
from trainer.config.loading import load_config
from trainer.hardware.serl_franka import SafetyBox
from trainer.runtime.distributed_run import distributed_plan
from trainer.runtime.rlpd_split import train_rlpd_split

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def two_nodes():
    with labelled_ray_cluster([{"num_cpus": 1}, {"num_cpus": 1}]):
        yield


@pytest.fixture
def servers():
    with fake_servers(2) as fakes:
        yield fakes


def test_each_placed_worker_drives_the_arm_of_its_own_copy(two_nodes, servers, tmp_path):
    document = {
        "name": "arms-placed",
        "env": {"name": "real_robot", "num_parallel_envs": 2, "max_episode_steps": 6,
                "real_robot": {"task": "push the block", "robots": robots(servers)}},
        "algorithm": {"name": "rlpd", "rlpd": {"batch_size": 16, "training_starts": 8,
                                               "hidden_sizes": [32, 32]}},
        "runner": {"iterations": 2, "seed": 0, "progress": False, "torch_threads": 1,
                   "output_dir": str(tmp_path / "run")},
        # The learner on node 0; an acting worker on each node, node 1 the robot node.
        "cluster": {"num_nodes": 2, "component_placement": {"actor": "0", "env": "0-1"}},
    }  # fmt: skip
    path = tmp_path / "arms.yaml"
    path.write_text(yaml.safe_dump(document))
    config = load_config(path)
    placed, history = [], []
    result = train_rlpd_split(
        config, distributed_plan(config), tmp_path / "run", on_placed=placed.extend,
        on_metrics=lambda it, metrics: history.append(metrics),
    )  # fmt: skip
    assert result.iteration == 2
    assert [(p.component, p.rank, p.node_rank) for p in placed] == [
        ("actor", 0, 0), ("env", 0, 0), ("env", 1, 1),
    ]  # fmt: skip
    # Each worker stepped its own arm: two episodes of six steps each.
    assert history[-1]["buffers/online"] == 2 * 2 * 6
    box = SafetyBox(*(tuple(BOX[key]) for key in ("xyz_low", "xyz_high", "rpy_low", "rpy_high")))
    for server in servers:
        poses = server.posed()
        assert len(poses) >= 12 and all(box.holds(pose) for pose in poses)
