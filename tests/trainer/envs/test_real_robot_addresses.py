"""A real_robot env's arms reached at their addresses: an arm named by `robot_ip` and
`port` is the SERL server at that host (an IPv6 address in brackets), and an address
that is not an http(s) robot server is refused before anything is sent."""

import pytest

from tests.trainer.hardware.fake_serl_server import fake_servers
from trainer.envs.real_robot import RealRobotEnv, arm_settings

BOX = {"xyz_low": [0.4, -0.1, 0.05], "xyz_high": [0.6, 0.1, 0.3],
       "rpy_low": [2.8, -0.3, -0.5], "rpy_high": [3.1416, 0.3, 0.5]}  # fmt: skip
ARM = {"safety_box": BOX, "action_scale": [0.01, 0.06, 1.0], "control_hz": 100.0,
       "timeout_s": 2.0, "joint_reset": False}  # fmt: skip


def test_an_arm_named_by_host_and_port_is_the_server_there():
    with fake_servers(1) as (server,):
        port = int(server.url.rstrip("/").rpartition(":")[2])
        env = RealRobotEnv(1, robots=[{**ARM, "robot_ip": "127.0.0.1", "port": port}])
        try:
            assert server.endpoints() == ["getstate"]
        finally:
            env.close()
    ipv6 = arm_settings({**ARM, "robot_ip": "fd00::3", "port": 5001})
    assert ipv6.url == "http://[fd00::3]:5001/"


@pytest.mark.parametrize(
    "address",
    [{"robot_ip": "127.0.0.1/getstate?", "port": 5000}, {"robot_ip": "a@127.0.0.1", "port": 1},
     {"url": "http://127.0.0.1:5000/?"}, {"url": "file:///etc/passwd"}],
)  # fmt: skip
def test_an_address_that_is_not_an_http_robot_server_is_refused(address):
    with pytest.raises(ValueError, match="robot server URL|host name or IP address"):
        RealRobotEnv(1, robots=[{**ARM, **address}])
