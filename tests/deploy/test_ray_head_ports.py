"""Every port a one-machine Ray head opens is chosen free at start (or fixed by a
setting), so two heads on one machine never collide, even while Ray's own fixed defaults
(10001 for the client server, 52365 for the dashboard agent, …) are taken. With those
taken, a head started the old way came up "alive" with its dashboard agent's HTTP
server disabled ("Agent port #52365 failed to bind") and its client server down."""

import socket
from contextlib import ExitStack, closing
from dataclasses import astuple
from pathlib import Path

import pytest
from ray.job_submission import JobStatus, JobSubmissionClient

from controlplane.core.stack import RayHeadPorts, ray_head_command, web_port
from tests.processes import wait_until
from tests.stack import RayHead

pytestmark = pytest.mark.timeout(600)

# Ray's fixed defaults, and the ones the one-machine mode used to pass.
RAY_FIXED_DEFAULTS = [6379, 6390, 8265, 10001, 52365, 8000]


def hold(stack: ExitStack, port: int) -> None:
    """Listen on `port` for the rest of the test (if someone else holds it, it is taken
    all the same)."""
    sock = stack.enter_context(socket.socket())
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        return
    sock.listen()


def test_every_port_is_passed_to_ray_and_none_repeats():
    ports = RayHeadPorts.from_environment({})
    command = ray_head_command(Path("/tmp/ray"), ports)
    for flag in (
        "--port", "--dashboard-port", "--ray-client-server-port",
        "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
        "--metrics-export-port", "--runtime-env-agent-port", "--node-manager-port",
        "--object-manager-port", "--min-worker-port", "--max-worker-port",
    ):  # fmt: skip
        assert flag in command
    opened = astuple(ports)[:-2]  # the worker range is 0, 0: the system picks per worker
    assert len(set(opened)) == len(opened)
    assert (ports.min_worker, ports.max_worker) == (0, 0)


def test_a_port_setting_fixes_that_port_and_a_bad_one_is_named():
    ports = RayHeadPorts.from_environment(
        {"ARMATURE_RAY_CLIENT_SERVER_PORT": "23456", "ARMATURE_RAY_MIN_WORKER_PORT": "24000",
         "ARMATURE_RAY_MAX_WORKER_PORT": "24100"}
    )  # fmt: skip
    assert (ports.client_server, ports.min_worker, ports.max_worker) == (23456, 24000, 24100)
    assert 23456 not in astuple(ports)[:-2][3:]
    with pytest.raises(ValueError, match="ARMATURE_RAY_DASHBOARD_PORT='eighty'"):
        RayHeadPorts.from_environment({"ARMATURE_RAY_DASHBOARD_PORT": "eighty"})


def test_the_web_port_is_the_setting_or_8000_or_a_free_one():
    assert web_port({"ARMATURE_PORT": "8123"}) == 8123
    with ExitStack() as stack:
        hold(stack, 8000)
        assert web_port({}) != 8000


def test_two_heads_come_up_at_once_while_rays_fixed_ports_are_taken(tmp_path):
    with ExitStack() as stack:
        for port in RAY_FIXED_DEFAULTS:
            hold(stack, port)
        # As `./armature up` chooses them, twice: a second checkout, or the test suite.
        first = stack.enter_context(
            closing(RayHead(tmp_path / "first", RayHeadPorts.from_environment({})))
        )
        second = stack.enter_context(
            closing(RayHead(tmp_path / "second", RayHeadPorts.from_environment({})))
        )
        opened = [astuple(head.ports)[:-2] for head in (first, second)]
        assert not set(RAY_FIXED_DEFAULTS) & set(opened[0] + opened[1])
        assert not set(opened[0]) & set(opened[1])
        # Both run jobs: a head whose dashboard agent could not bind its port comes up
        # "alive" all the same, but its Jobs API cannot reach the agent that runs jobs.
        for head in (first, second):
            jobs = JobSubmissionClient(head.url)
            job = jobs.submit_job(entrypoint="echo armature")
            wait_until(
                lambda jobs=jobs, job=job: jobs.get_job_status(job).is_terminal(), 120, "a job"
            )
            assert jobs.get_job_status(job) == JobStatus.SUCCEEDED, jobs.get_job_logs(job)
            assert "armature" in jobs.get_job_logs(job)
