"""A run the control plane launches drives an arm only within the limits its inventory
declares: the frozen config holds the inventory's safety box (shrunk where the
experiment asks for less, never widened), its control rate, action scale and joint
reset; an arm address no cluster declares is refused at its key path, with a cluster
picked or not."""

import pytest
import yaml

from controlplane.experiments.services import create_experiment
from controlplane.inventory.services import import_cluster_yaml
from controlplane.runs.frozen_config import frozen_section
from controlplane.runs.models import Run

pytestmark = pytest.mark.django_db

BOX = {"xyz_low": [0.4, -0.1, 0.05], "xyz_high": [0.6, 0.1, 0.3],
       "rpy_low": [2.8, -0.3, -0.5], "rpy_high": [3.1416, 0.3, 0.5]}  # fmt: skip
WIDE = {"xyz_low": [-1.0, -1.0, -1.0], "xyz_high": [1.0, 1.0, 1.0]}
INVENTORY = {"cluster": {"num_nodes": 2, "node_groups": [
    {"label": "learner", "node_ranks": 0},
    {"label": "arms", "node_ranks": 1, "hardware": {"type": "Franka", "configs": [
        {"robot_ip": "192.0.2.10", "node_rank": 1, "safety_box": BOX, "control_hz": 10,
         "action_scale": [0.01, 0.06, 1.0], "joint_reset": False,
         "cameras": [{"name": "wrist", "url": "http://192.0.2.20:8080/stream"}]},
    ]}},
]}}  # fmt: skip


def experiment(robot: dict) -> str:
    return yaml.safe_dump({
        "env": {"name": "real_robot", "num_parallel_envs": 1,
                "real_robot": {"robots": [robot]}},
        "algorithm": {"name": "rlpd"},
        "runner": {"iterations": 2},
    })  # fmt: skip


@pytest.fixture
def inventory():
    return import_cluster_yaml("lab", yaml.safe_dump(INVENTORY))


def problems(response) -> dict[str, str]:
    return {p["path"]: p["message"] for p in response.json()["errors"]}


@pytest.mark.parametrize("picked", [True, False])
def test_a_wider_box_a_faster_rate_and_a_larger_scale_are_frozen_as_the_inventorys(
    operator, inventory, picked
):
    create_experiment("greedy", experiment({
        "name": "left", "url": "http://192.0.2.10:5000/", "safety_box": WIDE,
        "control_hz": 100, "action_scale": [1.0, 1.0, 1.0], "joint_reset": True,
    }))  # fmt: skip
    body = {"experiment": "greedy", **({"cluster": "lab"} if picked else {})}
    launched = operator.post("/api/v1/runs", body, format="json")
    assert launched.status_code == 201, launched.content
    (robot,) = frozen_section(Run.objects.get(), "env", "real_robot")["robots"]
    assert robot["safety_box"] == BOX
    assert robot["control_hz"] == 10
    assert robot["action_scale"] == [0.01, 0.06, 1.0]
    assert robot["joint_reset"] is False
    assert [camera["url"] for camera in robot["cameras"]] == ["http://192.0.2.20:8080/stream"]


def test_an_address_the_inventory_does_not_declare_is_refused_at_its_key(operator, inventory):
    create_experiment("stray", experiment({"robot_ip": "192.0.2.99", "safety_box": BOX}))
    for body in ({"experiment": "stray"}, {"experiment": "stray", "cluster": "lab"}):
        launched = operator.post("/api/v1/runs", body, format="json")
        assert launched.status_code == 400
        message = problems(launched)["env.real_robot.robots[0].robot_ip"]
        assert "http://192.0.2.99:5000 is not an arm of the inventory" in message
    assert not Run.objects.exists()


def test_with_no_inventory_at_all_a_real_arm_is_refused(operator):
    create_experiment("alone", experiment({"url": "http://127.0.0.1:5000/", "safety_box": BOX}))
    launched = operator.post("/api/v1/runs", {"experiment": "alone"}, format="json")
    assert launched.status_code == 400
    assert "declared: none" in problems(launched)["env.real_robot.robots[0].url"]


def test_a_camera_of_another_host_is_refused(operator, inventory):
    create_experiment("peek", experiment({
        "robot_ip": "192.0.2.10", "safety_box": BOX,
        "cameras": [{"name": "inside", "url": "http://127.0.0.1:8000/admin/"}],
    }))  # fmt: skip
    launched = operator.post("/api/v1/runs", {"experiment": "peek"}, format="json")
    assert launched.status_code == 400
    assert "env.real_robot.robots[0].cameras[0].url" in problems(launched)
