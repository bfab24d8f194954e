"""Robot servers' and cameras' addresses in a config: only http(s) URLs (a robot server's
a base without query or fragment, a camera's without fragment) and host names or IP
addresses as `robot_ip`, each refused at its key path; and a URL written into text with
its password replaced."""

import pytest

from trainer.config import validate_config
from trainer.config.addresses import redact_url, robot_base_url
from trainer.config.errors import ConfigError

BOX = {"xyz_low": [0.4, -0.1, 0.05], "xyz_high": [0.6, 0.1, 0.3]}


def arms(*robots: dict) -> dict:
    return {
        "env": {"name": "real_robot", "num_parallel_envs": len(robots),
                "real_robot": {"robots": [{"safety_box": BOX, **robot} for robot in robots]}},
        "algorithm": {"name": "rlpd"},
    }  # fmt: skip


def refused(*robots: dict) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        validate_config(arms(*robots))
    return str(caught.value).splitlines()


def test_http_and_https_robot_servers_and_cameras_are_accepted():
    config = validate_config(arms(
        {"url": "http://172.16.0.2:5000/"},
        {"url": "HTTPS://arm-2.lab.example:8443/serl",
         "cameras": [{"name": "wrist", "url": "http://cam:pw@172.16.0.10:8080/stream?topic=/w"}]},
        {"robot_ip": "172.16.0.3"},
        {"robot_ip": "fd00::3", "port": 5001},
        {"robot_ip": "franka-4.lab"},
    ))  # fmt: skip
    robots = config.env.real_robot.robots
    assert robots[1].cameras[0].url == "http://cam:pw@172.16.0.10:8080/stream?topic=/w"
    assert robot_base_url(robots[3].robot_ip, robots[3].port) == "http://[fd00::3]:5001/"
    assert robot_base_url(robots[4].robot_ip, robots[4].port) == "http://franka-4.lab:5000/"


@pytest.mark.parametrize(
    ("url", "reason"),
    [("ftp://172.16.0.2:5000/", "http or https, not ftp"),
     ("file:///etc/passwd", "http or https, not file"),
     ("gopher://172.16.0.2:70/", "http or https, not gopher"),
     ("172.16.0.2:5000", "http or https"),
     ("http://172.16.0.2:5000/?", "query"),
     ("http://172.16.0.2:5000/serl?arm=1", "query"),
     ("http://172.16.0.2:5000/#", "fragment"),
     ("http:///getstate", "no host"),
     ("http://172.16.0.2:99999/", "port"),
     ("http://172.16.0.2:0/", "port"),
     ("http://172.16.0.2:5000/ get", "space"),
     ("http://arm\\@172.16.0.2/", "backslash"),
     ("http://172.16.0.2/a@b", "@")],
)  # fmt: skip
def test_a_robot_server_url_that_is_not_an_http_base_is_refused_at_its_key_path(url, reason):
    (line,) = refused({"url": "http://172.16.0.9:5000/"}, {"url": url})
    assert line.startswith("env.real_robot.robots[1].url: ")
    assert reason in line and "robot server URL" in line


@pytest.mark.parametrize(
    "url",
    ["file:///dev/video0", "ftp://172.16.0.10/x.jpg", "http://172.16.0.10/snapshot#x",
     "rtsp://172.16.0.10/stream", "//172.16.0.10/stream"],
)  # fmt: skip
def test_a_camera_url_that_is_not_http_is_refused_at_its_key_path(url):
    camera = {"name": "wrist", "url": url}
    (line,) = refused({"url": "http://172.16.0.9:5000/", "cameras": [camera]})
    assert line.startswith("env.real_robot.robots[0].cameras[0].url: ")
    assert "camera URL" in line


@pytest.mark.parametrize(
    "host",
    ["172.16.0.2/getstate?", "172.16.0.2:5000", "user@172.16.0.2", "http://172.16.0.2",
     "172.16.0.2#", "arm 1", "", "-arm", "[fd00::3]"],
)  # fmt: skip
def test_a_robot_ip_that_is_not_a_host_is_refused_at_its_key_path(host):
    (line,) = refused({"robot_ip": host})
    assert line.startswith("env.real_robot.robots[0].robot_ip: ")
    assert "host name or IP address" in line


def test_a_refused_url_never_shows_its_password():
    lines = refused({"url": "ftp://arm:s3cret@172.16.0.2/"},
                    {"url": "http://arm:s3cret@172.16.0.2/?"})  # fmt: skip
    assert len(lines) == 2 and not any("s3cret" in line for line in lines)


@pytest.mark.parametrize(
    ("url", "shown"),
    [("http://user:pass@host:5000/x?y=1", "http://user:***@host:5000/x?y=1"),
     ("https://user:@host/", "https://user:***@host/"),
     ("http://:pass@host/", "http://:***@host/"),
     ("http://user:p@ss@host/", "http://user:***@host/"),
     ("http://user:pa/ss@host/", "http://user:***@host/"),
     ("http://user:pass@[fd00::3]:5000/", "http://user:***@[fd00::3]:5000/"),
     ("http://user@host/", "http://user@host/"),
     ("http://host:5000/stream?topic=/a", "http://host:5000/stream?topic=/a"),
     ("http://host/?mail=a@b", "http://host/?mail=a@b"),
     ("not a url", "not a url"),
     ("http://[::1", "http://[::1"),
     ("", "")],
)  # fmt: skip
def test_redact_url_replaces_the_password_and_keeps_the_rest(url, shown):
    assert redact_url(url) == shown
