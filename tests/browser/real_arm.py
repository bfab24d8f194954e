"""The real-arm console tests' arm: a fake SERL robot server, a fake camera, the
inventory's cluster declaring them with their safety box, and the RLPD run on them
(`env.name: real_robot`), which asks for a wider box than the inventory's."""

import yaml

from controlplane.inventory.services import import_cluster_yaml
from tests.browser.operator_run import BROWSER_DEADMAN_S
from tests.trainer.hardware.fake_camera import FakeCamera
from tests.trainer.hardware.fake_serl_server import FakeSerlServer

BOX = {"xyz_low": [0.4, -0.1, 0.05], "xyz_high": [0.6, 0.1, 0.3],
       "rpy_low": [2.8, -0.3, -0.5], "rpy_high": [3.1416, 0.3, 0.5]}  # fmt: skip
WIDE = {"xyz_low": [0.0, -1.0, 0.0], "xyz_high": [1.0, 1.0, 1.0]}  # what the run asks for
ITERATIONS = 8


def declare_arm(server: FakeSerlServer, camera: FakeCamera) -> None:
    """The inventory's cluster with the arm on its node 1: the box the run is held to."""
    arm = {"robot_ip": "127.0.0.1", "url": server.url, "node_rank": 1, "safety_box": BOX,
           "action_scale": [0.02, 0.1, 1.0], "control_hz": 10,
           "cameras": [{"name": "wrist", "url": camera.url("stream")},
                       {"name": "front", "url": camera.url("snapshot")}]}  # fmt: skip
    import_cluster_yaml("lab", yaml.safe_dump({"cluster": {"num_nodes": 2, "node_groups": [
        {"label": "learner", "node_ranks": 0},
        {"label": "arms", "node_ranks": 1, "hardware": {"type": "Franka", "configs": [arm]}},
    ]}}))  # fmt: skip


def arm_config(server: FakeSerlServer, camera: FakeCamera) -> str:
    document = {
        "name": "real-arm",
        "env": {
            "name": "real_robot", "num_parallel_envs": 1, "max_episode_steps": 40,
            "real_robot": {"task": "reach the far corner", "reconnect_s": 60, "robots": [{
                "name": "franka-0", "url": server.url, "safety_box": WIDE,
                "action_scale": [0.02, 0.1, 1.0], "control_hz": 10, "timeout_s": 2.0,
                "reset_pose": [0.5, 0.0, 0.2, 1.0, 0.0, 0.0, 0.0],
                "cameras": [{"name": "wrist", "url": camera.url("stream")},
                            {"name": "front", "url": camera.url("snapshot")}],
            }]},
            "interventions": {"source": "console", "deadman_s": BROWSER_DEADMAN_S,
                              "control_hz": 10,
                              "on_link_loss": "release"},
        },
        "algorithm": {"name": "rlpd", "rlpd": {"batch_size": 32, "training_starts": 20,
                                               "hidden_sizes": [32, 32]}},
        "runner": {"iterations": ITERATIONS, "seed": 0, "checkpoint_every": 4,
                   "torch_threads": 1},
    }  # fmt: skip
    return yaml.safe_dump(document, sort_keys=False)
