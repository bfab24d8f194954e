"""`./armature up`'s head options and `./armature join`, without starting anything: the
default stays one machine on loopback exactly; `--bind`/`--advertise` make a head other
nodes can join (labelled node rank 0, the web URL others report to); a user's
ARMATURE_WEB_URL is kept; each wrong value is refused before anything starts, naming
it. The commands at work on two network namespaces: tests/deploy/test_multi_node.py."""

import argparse
import os
import signal
import socket
import sys
import threading
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from controlplane.core import join
from controlplane.core.management.commands.up import allowed_hosts, web_url
from controlplane.core.stack import (
    LOCAL,
    AddressError,
    HeadAddresses,
    RayHeadPorts,
    dashboard_url,
    ray_head_command,
    ray_node_command,
    ray_node_port_flags,
)
from trainer.cluster import NODE_GROUP_LABEL, NODE_RANK_LABEL

NOT_HERE = "198.51.100.7"  # TEST-NET-2: no machine's own address


def this_machines_address() -> str:
    """An IPv4 address of this machine other than loopback (the one facing outwards)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: it picks a route
        except OSError:
            pytest.skip("this machine has no route off loopback")
        address = probe.getsockname()[0]
    if address.startswith("127."):
        pytest.skip("this machine has no address off loopback")
    return address


def option_after(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def test_the_default_is_one_machine_on_loopback_as_before():
    addresses = HeadAddresses.choose("127.0.0.1")
    assert addresses == LOCAL and not addresses.serves_other_nodes
    ports = RayHeadPorts.choose()
    command = ray_head_command(Path("/tmp/ray"), ports)
    assert option_after(command, "--node-ip-address") == "127.0.0.1"
    assert option_after(command, "--dashboard-host") == "127.0.0.1"
    assert option_after(command, "--labels") == f"{NODE_RANK_LABEL}=0"  # the head is node 0
    assert dashboard_url(ports) == f"http://127.0.0.1:{ports.dashboard}"
    assert web_url({}, addresses, 8000) == "http://127.0.0.1:8000"
    assert allowed_hosts({}, "http://127.0.0.1:8000", addresses) is None  # untouched


def test_every_interface_alone_opens_the_ui_and_keeps_ray_on_loopback():
    addresses = HeadAddresses.choose("0.0.0.0")
    assert addresses.advertise == "127.0.0.1" and addresses.ray_listen == "127.0.0.1"
    assert web_url({}, addresses, 8000) == "http://127.0.0.1:8000"


def test_a_head_for_other_nodes_advertises_its_address_to_ray_and_in_the_web_url():
    address = this_machines_address()
    for addresses in (HeadAddresses.choose(address), HeadAddresses.choose("0.0.0.0", address)):
        assert addresses.advertise == address and addresses.serves_other_nodes
        ports = RayHeadPorts.choose()
        command = ray_head_command(Path("/tmp/ray"), ports, addresses=addresses)
        assert option_after(command, "--node-ip-address") == address
        assert option_after(command, "--dashboard-host") == addresses.bind
        assert option_after(command, "--labels") == f"{NODE_RANK_LABEL}=0"
        assert web_url({}, addresses, 8123) == f"http://{address}:8123"
        # The web server must take requests for that host, or trainers get 400s.
        hosts = allowed_hosts({}, f"http://{address}:8123", addresses)
        assert hosts is not None and address in hosts.split(",")
    assert (
        dashboard_url(ports, HeadAddresses.choose(address)) == f"http://{address}:{ports.dashboard}"
    )
    assert dashboard_url(ports, HeadAddresses.choose("0.0.0.0", address)).startswith(
        "http://127.0.0.1:"
    )


@pytest.mark.parametrize(
    ("bind", "advertise", "message"),
    [
        ("localhost", None, "--bind 'localhost' is not an IPv4 address"),
        ("10.0.0.300", None, "--bind '10.0.0.300' is not an IPv4 address"),
        (NOT_HERE, None, f"--bind {NOT_HERE} is not an address of this machine"),
        ("0.0.0.0", "0.0.0.0", "--advertise 0.0.0.0 is not an address other machines can dial"),
        ("0.0.0.0", "head.example", "--advertise 'head.example' is not an IPv4 address"),
        ("0.0.0.0", NOT_HERE, f"--advertise {NOT_HERE} is not an address of this machine"),
        ("127.0.0.1", NOT_HERE, f"--advertise {NOT_HERE} with --bind 127.0.0.1"),
    ],
)
def test_a_wrong_address_is_refused_naming_it(bind, advertise, message):
    with pytest.raises(AddressError, match=message.replace(".", r"\.")):
        HeadAddresses.choose(bind, advertise)


def test_up_refuses_a_wrong_address_before_starting_anything():
    with pytest.raises(CommandError, match="--advertise 0.0.0.0 is not an address"):
        call_command("up", "--advertise", "0.0.0.0")


def test_a_web_url_the_user_set_is_kept_and_a_malformed_one_named():
    env = {"ARMATURE_WEB_URL": "https://armature.example.org/"}
    assert web_url(env, LOCAL, 8000) == "https://armature.example.org"
    with pytest.raises(CommandError, match="ARMATURE_WEB_URL='ftp://x' is not an http"):
        web_url({"ARMATURE_WEB_URL": "ftp://x"}, LOCAL, 8000)


def test_set_allowed_hosts_must_admit_the_web_urls_host(settings):
    settings.ALLOWED_HOSTS = ["armature.example.org"]
    environ = {"ALLOWED_HOSTS": "armature.example.org"}
    assert allowed_hosts(environ, "https://armature.example.org", LOCAL) is None
    with pytest.raises(CommandError, match="does not admit 10.0.0.5:8000, the host of the web"):
        allowed_hosts(environ, "http://10.0.0.5:8000", LOCAL)


def test_a_joining_node_is_labelled_with_its_rank_and_opens_free_ports():
    flags = ray_node_port_flags({"ARMATURE_RAY_NODE_MANAGER_PORT": "23456"})
    command = ray_node_command(
        "10.0.0.5:6390", 2, Path("/tmp/node"), flags, node_group="sim", num_cpus=4
    )
    assert option_after(command, "--address") == "10.0.0.5:6390"
    assert option_after(command, "--labels") == f"{NODE_RANK_LABEL}=2,{NODE_GROUP_LABEL}=sim"
    assert option_after(command, "--temp-dir") == "/tmp/node"  # not the head's path
    assert option_after(command, "--node-manager-port") == "23456"
    assert "--port" not in command and "--dashboard-port" not in command  # the head's
    opened = [int(option_after(flags, f)) for f in flags[::2] if "worker" not in f]
    assert len(set(opened)) == len(opened) and 52365 not in opened  # not Ray's fixed one
    with pytest.raises(ValueError, match="ARMATURE_RAY_METRICS_EXPORT_PORT='x'"):
        ray_node_port_flags({"ARMATURE_RAY_METRICS_EXPORT_PORT": "x"})


def join_error(capsys, *argv: str, environ: dict | None = None) -> str:
    """What `./armature join ARGV` prints when it refuses (exit status 2)."""
    with pytest.raises(SystemExit) as exited:
        raise SystemExit(join.main(list(argv), environ or {}))
    assert exited.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["10.0.0.5:99999", "--node-rank", "1"], "'99999' is not a port number"),
        (["no-such-host.invalid:6390", "--node-rank", "1"], "'no-such-host.invalid' is neither"),
        (["10.0.0.5", "--node-rank", "0"], "0 is the head's rank"),
        (["10.0.0.5", "--node-rank", "one"], "'one' is not a whole number"),
        (["10.0.0.5"], "the following arguments are required: --node-rank"),
        (["10.0.0.5", "--node-rank", "1", "--node-group", "a b"], "'a b' cannot be a Ray label"),
        (["10.0.0.5", "--node-rank", "1", "--num-cpus", "-1"], "'-1' is not a count"),
        (["10.0.0.5", "--node-rank", "1", "--token", "t", "--advertise", NOT_HERE],
         f"--advertise {NOT_HERE} is not an address of this machine"),
        (["10.0.0.5", "--node-rank", "1", "--token-file", "/no/such/file"],
         "--token-file /no/such/file: No such file or directory"),
        (["10.0.0.5", "--node-rank", "1"], "no Ray token: the head"),
    ],
)  # fmt: skip
def test_join_refuses_a_wrong_argument_naming_it(capsys, tmp_path, argv, message):
    environ = {"ARMATURE_VAR_DIR": str(tmp_path)}  # no var/ray_auth_token there
    assert message in join_error(capsys, *argv, environ=environ)


def test_join_says_when_the_head_cannot_be_reached(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(join, "REACH_TIMEOUT_S", 0.5)
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # nothing listens there
    error = join_error(capsys, f"127.0.0.1:{port}", "--node-rank", "1", "--token", "t",
                       environ={"ARMATURE_VAR_DIR": str(tmp_path)})  # fmt: skip
    assert f"cannot reach the Ray head at 127.0.0.1:{port}" in error
    assert "./armature up --advertise 127.0.0.1" in error


def test_join_takes_the_token_from_the_file_the_option_the_environment_or_var(tmp_path):
    def auth(environ: dict, **options) -> dict:
        args = argparse.Namespace(**{"token_file": None, "token": None, **options})
        return join.auth_env(args, {"ARMATURE_VAR_DIR": str(tmp_path), **environ})

    (tmp_path / "copy").write_text("from-file\n")
    assert auth({}, token_file=tmp_path / "copy") == {
        "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "from-file"
    }  # fmt: skip
    assert auth({"RAY_AUTH_TOKEN": "from-env"})["RAY_AUTH_TOKEN"] == "from-env"
    (tmp_path / "ray_auth_token").write_text("this-checkouts")
    assert auth({})["RAY_AUTH_TOKEN"] == "this-checkouts"
    (tmp_path / "ray_auth_token").unlink()
    assert auth({"RAY_AUTH_MODE": "disabled"}) == {"RAY_AUTH_MODE": "disabled"}
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(join.JoinError, match="is empty"):
        auth({}, token_file=tmp_path / "empty")


def test_a_node_that_stops_by_itself_is_started_again_until_join_is_stopped(tmp_path, monkeypatch):
    monkeypatch.setattr(join, "RESTART_PAUSE_S", 0.05)
    starts = []

    def command() -> list[str]:
        starts.append(command)
        if len(starts) < 3:
            return ["sh", "-c", "exit 3"]  # a node that gave up (its head went away)
        os.kill(os.getpid(), signal.SIGTERM)  # what stopping join sends, as it starts
        return ["sleep", "60"]

    with socket.socket() as head:  # the head answers
        head.bind(("127.0.0.1", 0))
        head.listen()
        keeper = join.NodeKeeper(command, os.environ, str(tmp_path), head.getsockname())
        assert keeper.run() == 0
    assert len(starts) == 3
    assert keeper.node.returncode == -signal.SIGTERM  # stopped, not left to its grace


def test_a_refused_token_stops_join_with_the_reason_instead_of_starting_again(tmp_path, capsys):
    refused = "ray.exceptions.AuthenticationError: RPC error: InvalidAuthToken: …"
    starts = []

    def command() -> list[str]:
        starts.append(command)
        return ["sh", "-c", f"echo '{refused}'; exit 1"]

    keeper = join.NodeKeeper(command, os.environ, str(tmp_path), ("127.0.0.1", 1))
    assert keeper.run() == 2 and len(starts) == 1
    output = capsys.readouterr()
    assert refused in output.out  # Ray's own words passed on
    assert "the head refused this node's Ray token" in output.err


def test_ctrl_c_stops_the_node_even_when_joins_output_pipe_is_gone(tmp_path, monkeypatch):
    """`./armature join … | tee join.log`, then Ctrl-C: tee exits on the same SIGINT, and
    join's lines then meet a closed pipe. The node is stopped all the same."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader (tee) is gone
    broken = os.fdopen(write_end, "w")
    monkeypatch.setattr(sys, "stdout", broken)
    monkeypatch.setattr(sys, "stderr", broken)

    def command() -> list[str]:
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()  # Ctrl-C
        return ["sh", "-c", "echo started; exec sleep 60"]

    keeper = join.NodeKeeper(command, os.environ, str(tmp_path), ("127.0.0.1", 1))
    try:
        assert keeper.run() == 0
    finally:
        broken.close()
    assert keeper.node.returncode == -signal.SIGTERM  # told to stop, not left running
