"""The SERL robot-server driver against a fake server with SERL's endpoints and JSON:
actions integrate into poses as HIL-SERL's env does, every pose sent lies in the safety
box, the gripper and reset follow SERL's calls, and a silent or dead server is a lost
link that raises at once and sends nothing more until the server answers again. The
server's address is an http(s) base URL the endpoints are joined onto: a redirect is
never followed, an answer is read up to a cap, a closed port and a silent host read
the same, and a password in the URL is sent but never written into a message."""

import base64
import time
import traceback
import tracemalloc

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from tests.trainer.hardware.fake_serl_server import HOME, FakeSerlServer
from tests.trainer.hardware.hostile_server import (
    HostileServer,
    SilentHost,
    closed_port,
    endless_body,
    redirect_to,
    status,
)
from trainer.hardware.serl_franka import (
    MAX_ANSWER_BYTES,
    RobotLinkLost,
    SafetyBox,
    SerlFranka,
    SerlSettings,
)

pytestmark = pytest.mark.timeout(60)

BOX = SafetyBox(xyz_low=(0.4, -0.1, 0.05), xyz_high=(0.6, 0.1, 0.3),
                rpy_low=(2.8, -0.3, -0.5), rpy_high=(np.pi, 0.3, 0.5))  # fmt: skip


@pytest.fixture
def server():
    fake = FakeSerlServer().start()
    yield fake
    fake.stop()


def arm(server: FakeSerlServer, **settings) -> SerlFranka:
    # A deadline a loaded CI machine's fake server meets; the silent-server test sets its own.
    options = {"safety_box": BOX, "control_hz": 200.0, "timeout_s": 2.0, **settings}
    robot = SerlFranka("franka-0", SerlSettings(url=server.url, **options))
    robot.connect()
    return robot


def test_an_action_moves_the_measured_pose_as_hil_serl_scales_it(server):
    robot = arm(server, action_scale=(0.01, 0.06, 1.0))
    robot.send_action([1.0, -0.5, 0.0, 0.0, 0.0, 0.5, 0.0])
    (sent,) = server.posed()
    assert sent[:3] == pytest.approx([HOME[0] + 0.01, HOME[1] - 0.005, HOME[2]])
    turned = Rotation.from_euler("xyz", [0, 0, 0.03]) * Rotation.from_quat(HOME[3:])
    assert Rotation.from_quat(sent[3:]).approx_equal(turned, atol=1e-9)
    assert robot.read_state()["pose"] == pytest.approx(sent)  # read back after the step
    assert server.endpoints() == ["getstate", "pose", "getstate"]


def test_every_pose_sent_lies_in_the_safety_box_however_far_it_is_pushed(server):
    robot = arm(server, action_scale=(0.05, 0.2, 1.0))
    rng = np.random.default_rng(0)
    for _ in range(40):
        robot.send_action([1.0, 1.0, -1.0, *rng.uniform(-1, 1, 3), 0.0])
    poses = server.posed()
    assert all(BOX.holds(pose) for pose in poses)
    assert poses[-1][:3] == pytest.approx([0.6, 0.1, 0.05])  # pinned to the box's corner
    assert not BOX.holds([0.7, 0.0, 0.2, *HOME[3:]])  # what the box refuses, it clips


def test_the_gripper_closes_when_open_and_opens_when_closed_once_each(server):
    robot = arm(server)
    for command in (-1.0, -1.0, 0.2, 1.0, 1.0):
        robot.send_action([0, 0, 0, 0, 0, 0, command])
    gripper = [e for e in server.endpoints() if e.endswith("_gripper")]
    assert gripper == ["close_gripper", "open_gripper"]


def test_reset_clears_errors_homes_the_joints_and_goes_to_the_reset_pose(server):
    reset_pose = (0.55, 0.05, 0.25, 1.0, 0.0, 0.0, 0.0)
    robot = arm(server, joint_reset=True, reset_pose=reset_pose)
    server.gripper_pos = 0.0
    robot.reset()
    assert server.endpoints()[1:] == ["getstate", "clearerr", "jointreset", "pose",
                                      "open_gripper", "getstate"]  # fmt: skip
    assert server.posed() == [pytest.approx(list(reset_pose))]
    assert robot.read_state()["gripper_pos"] == [1.0]


def test_steps_keep_the_control_rate(server):
    robot = arm(server, control_hz=20.0)
    started = time.monotonic()
    for _ in range(6):
        robot.send_action([0.0] * 7)
    assert time.monotonic() - started >= 5 / 20.0  # six steps span five periods at least


def test_a_silent_server_is_a_lost_link_that_sends_nothing_more_until_it_answers(server):
    robot = arm(server, timeout_s=1.0)
    robot.send_action([0.5, 0, 0, 0, 0, 0, 0])
    server.fall_silent()
    with pytest.raises(
        RobotLinkLost, match=r"franka-0: the robot server at 127\.0\.0\.1:\d+ did not answer "
        r"pose within 1\.0 s"
    ):  # fmt: skip
        robot.send_action([0.5, 0, 0, 0, 0, 0, 0])
    with pytest.raises(RobotLinkLost, match="link lost"):
        robot.send_action([0.5, 0, 0, 0, 0, 0, 0])
    robot.stop()  # nothing to send to: the server's controller holds its last target
    sent = len(server.posed())
    server.speak_again()
    with pytest.raises(RobotLinkLost, match="link lost"):
        robot.send_action([0.5, 0, 0, 0, 0, 0, 0])
    assert len(server.posed()) == sent  # no stale target after the gap
    robot.connect()
    robot.send_action([0.5, 0, 0, 0, 0, 0, 0])
    assert len(server.posed()) == sent + 1


def test_a_dead_server_is_a_lost_link_and_a_restarted_one_is_reached_again(server):
    robot = arm(server, timeout_s=1.0)
    server.stop()
    with pytest.raises(RobotLinkLost, match="did not answer pose"):
        robot.send_action([0.0] * 7)
    server.start()  # the same port
    robot.connect()
    robot.stop()  # holds still: the measured pose is the new target
    assert server.posed()[-1] == pytest.approx(server.pose)


def test_bad_settings_and_actions_are_named(server):
    with pytest.raises(ValueError, match=r"safety box xyz: 3 lows each at most its high"):
        SafetyBox(xyz_low=(0.6, 0, 0), xyz_high=(0.4, 1, 1))
    robot = arm(server)
    with pytest.raises(ValueError, match=r"SERL actions are 7 numbers, not \(6,\)"):
        robot.send_action([0.0] * 6)


def unconnected(url: str, timeout_s: float = 2.0) -> SerlFranka:
    return SerlFranka("franka-0", SerlSettings(url=url, safety_box=BOX, timeout_s=timeout_s))


@pytest.mark.parametrize(
    "url",
    ["{base}?", "{base}?x=1", "{base}#", "{base}#top", "ftp://127.0.0.1:5000/",
     "file:///etc/passwd", "gopher://127.0.0.1:5000/", "http:///getstate", "127.0.0.1:5000"],
)  # fmt: skip
def test_only_an_http_base_url_without_query_or_fragment_is_a_robot_server(server, url):
    with pytest.raises(ValueError, match="robot server URL"):
        unconnected(url.format(base=server.url))
    assert server.requests == []


def test_endpoints_are_joined_onto_the_urls_path(server):
    recorder = HostileServer(status(500))
    try:
        for base in ("serl", "serl/", "serl/arm;1/"):
            with pytest.raises(RobotLinkLost):
                unconnected(recorder.url(base)).connect()
        paths = [path for _, path, _ in recorder.requests]
        assert paths == ["/serl/getstate", "/serl/getstate", "/serl/arm;1/getstate"]
    finally:
        recorder.stop()


def test_a_redirect_is_never_followed(server):
    elsewhere = HostileServer(redirect_to(server.url + "getstate"))
    try:
        for code in (301, 302, 303, 307, 308):
            elsewhere.answer = redirect_to(server.url + "getstate", code)
            robot = unconnected(elsewhere.url())
            with pytest.raises(RobotLinkLost, match=rf"redirect \(HTTP {code}\).*never followed"):
                robot.connect()
        assert server.requests == []  # the other port was never reached
    finally:
        elsewhere.stop()


def test_a_closed_port_and_a_silent_host_read_the_same():
    silent, closed = SilentHost(), closed_port()
    try:
        messages = {}
        for port in (silent.port, closed):
            with pytest.raises(RobotLinkLost) as caught:
                unconnected(f"http://127.0.0.1:{port}/", timeout_s=0.5).connect()
            messages[port] = str(caught.value).replace(str(port), "PORT")
            assert caught.value.__cause__ is None and caught.value.__suppress_context__
        assert (
            messages[silent.port]
            == messages[closed]
            == ("franka-0: the robot server at 127.0.0.1:PORT did not answer getstate within 0.5 s")
        )
    finally:
        silent.close()


def test_an_endless_answer_is_refused_at_the_cap_in_bounded_memory():
    flood = HostileServer(endless_body(32 * MAX_ANSWER_BYTES, "application/json"))
    tracemalloc.start()
    try:
        robot = unconnected(flood.url())
        with pytest.raises(RobotLinkLost, match=r"answered getstate with more than 1 MiB"):
            robot.connect()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        flood.stop()
    assert peak < 3 * MAX_ANSWER_BYTES, f"{peak} bytes held at once"
    assert flood.sent < 32 * MAX_ANSWER_BYTES  # the driver hung up


def test_a_password_in_the_url_is_sent_but_never_written(server):
    recorder = HostileServer(status(500))
    try:
        robot = unconnected(f"http://arm:s3cret@127.0.0.1:{recorder.port}/serl/")
        with pytest.raises(RobotLinkLost, match="HTTP 500") as answered:
            robot.connect()
        (_, path, headers) = recorder.requests[0]
        assert path == "/serl/getstate"
        assert headers["Authorization"] == "Basic " + base64.b64encode(b"arm:s3cret").decode()
        recorder.stop()
        with pytest.raises(RobotLinkLost, match="did not answer") as unanswered:
            robot.connect()
        for caught in (answered, unanswered):
            written = "".join(traceback.format_exception(caught.value)) + repr(robot.__dict__)
            assert "127.0.0.1" in written and "s3cret" not in written
    finally:
        recorder.stop()
