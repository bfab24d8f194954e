"""A real_robot env's arms from the cluster's inventory: each Franka hardware entry is
an arm (its robot_ip the SERL server's host, its other keys the arm's), a bad entry is
named at its path under `cluster`, and arms listed in the env win."""

import pytest

from trainer.config import validate_config
from trainer.config.errors import ConfigError

BOX = {"xyz_low": [0.4, -0.1, 0.05], "xyz_high": [0.6, 0.1, 0.3]}


def arms_config(*entries: dict, robots: list | None = None) -> dict:
    return {
        "env": {"name": "real_robot", "num_parallel_envs": max(len(entries), 1),
                "real_robot": {"robots": robots or []}},
        "algorithm": {"name": "rlpd"},
        "cluster": {"num_nodes": 2, "node_groups": [
            {"label": "learner", "node_ranks": 0, "accelerators": {"type": "A100", "count": 1}},
            {"label": "robot", "node_ranks": 1,
             "hardware": {"type": "Franka", "configs": list(entries)}},
        ]},
    }  # fmt: skip


def test_each_franka_in_the_inventory_is_an_arm_with_its_own_keys():
    config = validate_config(arms_config(
        {"robot_ip": "192.0.2.10", "node_rank": 1, "safety_box": BOX,
         "camera_serials": ["322142001230"],
         "cameras": [{"name": "wrist", "url": "http://192.0.2.20/stream"}]},
        {"robot_ip": "192.0.2.11", "node_rank": 1, "safety_box": BOX, "port": 5001,
         "name": "franka-right"},
    ))  # fmt: skip
    left, right = config.env.real_robot.robots
    assert (left.name, left.robot_ip, left.port) == ("franka-1-0", "192.0.2.10", 5000)
    assert left.cameras[0].url == "http://192.0.2.20/stream"
    assert left.safety_box.xyz_high == [0.6, 0.1, 0.3]
    assert (right.name, right.robot_ip, right.port) == ("franka-right", "192.0.2.11", 5001)


def test_a_bad_inventory_entry_is_named_where_it_is():
    with pytest.raises(ConfigError) as caught:
        validate_config(arms_config({"robot_ip": "192.0.2.10", "node_rank": 1}))
    assert "cluster.node_groups[1].hardware.configs[0].safety_box" in str(caught.value)


def test_arms_listed_in_the_env_win_and_none_anywhere_is_named():
    listed = [{"name": "bench-arm", "url": "http://127.0.0.1:5000/", "safety_box": BOX}]
    config = validate_config(arms_config(
        {"robot_ip": "192.0.2.10", "node_rank": 1, "safety_box": BOX}, robots=listed
    ))  # fmt: skip
    assert [robot.name for robot in config.env.real_robot.robots] == ["bench-arm"]
    data = arms_config()
    data["cluster"]["node_groups"].pop()
    with pytest.raises(ConfigError, match="the cluster has no hardware of type Franka"):
        validate_config(data)


WIDE = {"xyz_low": [0.0, -1.0, 0.0], "xyz_high": [1.0, 1.0, 1.0],
        "rpy_low": [0.0, -3.1416, -3.1416], "rpy_high": [3.1416, 3.1416, 3.1416]}  # fmt: skip
DECLARED = {"robot_ip": "192.0.2.10", "node_rank": 1, "safety_box": BOX, "control_hz": 5,
            "action_scale": [0.01, 0.05, 1.0], "joint_reset": False,
            "cameras": [{"name": "wrist", "url": "http://192.0.2.20/stream"}]}  # fmt: skip


def test_an_arm_the_inventory_declares_keeps_its_limits_whatever_the_env_lists():
    listed = [{"name": "mine", "robot_ip": "192.0.2.10", "safety_box": WIDE, "control_hz": 50,
               "action_scale": [0.1, 0.01, 2.0], "joint_reset": True}]  # fmt: skip
    (robot,) = validate_config(arms_config(DECLARED, robots=listed)).env.real_robot.robots
    assert robot.name == "mine"
    assert (robot.safety_box.xyz_low, robot.safety_box.xyz_high) == (BOX["xyz_low"],
                                                                     BOX["xyz_high"])  # fmt: skip
    assert robot.control_hz == 5
    assert robot.action_scale == [0.01, 0.01, 1.0]  # each capped, never raised
    assert robot.joint_reset is False
    assert [camera.name for camera in robot.cameras] == ["wrist"]  # the inventory's


def test_the_same_server_written_as_a_url_is_the_same_arm_and_may_only_shrink():
    small = {"xyz_low": [0.45, -0.05, 0.1], "xyz_high": [0.55, 0.05, 0.2]}
    listed = [{"url": "http://192.0.2.10:5000", "safety_box": small}]
    (robot,) = validate_config(arms_config(DECLARED, robots=listed)).env.real_robot.robots
    assert (robot.safety_box.xyz_low, robot.safety_box.xyz_high) == (small["xyz_low"],
                                                                     small["xyz_high"])  # fmt: skip
    assert robot.control_hz == 5


def test_a_box_or_camera_outside_the_inventorys_is_named():
    outside = {"xyz_low": [0.7, -0.1, 0.05], "xyz_high": [0.9, 0.1, 0.3]}
    listed = [{"robot_ip": "192.0.2.10", "safety_box": outside,
               "cameras": [{"name": "elsewhere", "url": "http://192.0.2.99/stream"}]}]  # fmt: skip
    with pytest.raises(ConfigError) as caught:
        validate_config(arms_config(DECLARED, robots=listed))
    text = str(caught.value)
    assert "env.real_robot.robots[0].safety_box.xyz_low[0]" in text
    assert "outside the inventory's [0.4, 0.6]" in text
    assert "env.real_robot.robots[0].cameras[0].url" in text
