"""Two machines on one host, as docs/multi-node.md sets them up: network namespaces on a
bridge, the Ray head in the first started as `./armature up --bind ADDR` starts it
(node rank 0, token authentication), a node in the second joined with `./armature join
HEAD --node-rank 1 --token-file …`, and the control plane (web server, worker) on the
host, where the trainers report over the bridge. Runs launched through the API run their
processes where the placement says (each process's network namespace is checked) and
report live; stopping the app, and a cancel through the API, each save a checkpoint,
record `stopped` and leave no process, and Resume continues from it; a
placement the cluster cannot hold is refused; Ctrl-C takes the joined node out. One
cluster for the module, and its runs side by side: starting processes is most of the
time. Skipped, with the reason, where namespaces cannot be made."""

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from rest_framework.test import APIClient

from controlplane.core import join
from controlplane.core.stack import (
    HeadAddresses,
    RayHeadPorts,
    dashboard_url,
    ray_head_command,
    ray_head_env,
)
from controlplane.experiments.services import create_experiment
from controlplane.runs.artifacts import run_artifact_dir
from controlplane.runs.interruption import interrupt_active_runs
from controlplane.runs.models import Run, RunEvent
from tests import netns
from tests.processes import start, stop, wait_until
from tests.stack import Stack
from trainer.cluster import NODE_RANK_LABEL

pytestmark = [pytest.mark.netns, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
TOKEN = secrets.token_hex(32)
CONFIG = (ROOT / "examples" / "builtin_ppo.yaml").read_text()
# Small and endless: the tests stop these runs themselves.
SMALL = ["env.num_parallel_envs=4", "algorithm.data_batch_size=8", "runner.iterations=100000",
         "runner.torch_threads=1", "runner.progress=false"]  # fmt: skip
LAYOUTS = {
    "env workers on node 1": "{actor: '0', env: '1'}",
    "an actor rank on each node": "{actor: '0-1'}",
}


@dataclass
class Cluster:
    head: netns.Namespace
    node: netns.Namespace
    ray_url: str
    web_url: str
    join: subprocess.Popen  # `./armature join` in the node's namespace


def stop_together(stops: list[Callable[[], None]]) -> None:
    threads = [threading.Thread(target=one) for one in stops]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def ray_nodes(ray_url: str) -> list[dict]:
    """The live Ray nodes, from the dashboard's state API (with the token)."""
    request = urllib.request.Request(
        f"{ray_url}/api/v0/nodes?detail=1&limit=100",
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            nodes = json.load(reply)["data"]["result"]["result"]
    except (OSError, ValueError, KeyError):
        return []
    return [node for node in nodes if node.get("state") == "ALIVE"]


@pytest.fixture(scope="module")
def cluster(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[Cluster]:
    reason = netns.unavailable()
    if reason:
        pytest.skip(reason)
    logs = tmp_path_factory.mktemp("multi-node")
    token_file = logs / "ray_auth_token"  # the copy a user brings to the other machine
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    began = time.monotonic()
    with netns.namespaces(2) as bridge, ExitStack() as running:
        head_ns, node_ns = bridge.spaces
        # What `./armature up --bind <head_ns.address>` starts (its web server and worker
        # run on the host instead, on the test database).
        addresses = HeadAddresses(bind=head_ns.address, advertise=head_ns.address)
        ports = RayHeadPorts.from_environment({})
        temp_dir = Path(tempfile.mkdtemp(prefix="armray-"))
        running.callback(shutil.rmtree, temp_dir, True)
        stops: list[Callable[[], None]] = []  # all at once at the end: each waits
        running.callback(stop_together, stops)
        head = start(
            head_ns.exec(ray_head_command(temp_dir, ports, addresses=addresses)),
            {**os.environ, **ray_head_env(TOKEN)},
            logs / "ray-head.log",
        )
        # Briefly: a Ray head takes half a minute to stop itself (its drain, then each
        # process), and what is left in its namespace is killed with it.
        stops.append(lambda: stop(head, 5.0))
        ray_url = dashboard_url(ports, addresses)
        with django_db_blocker.unblock():
            stack = Stack(
                logs,
                {"RAY_ADDRESS": ray_url, "RAY_AUTH_TOKEN": TOKEN,
                 "ALLOWED_HOSTS": f"localhost,127.0.0.1,{bridge.host}"},
                host=bridge.host,
            )  # fmt: skip
        stops.append(stack.close)
        stack.start_worker()  # meanwhile the head starts
        stack.start_web()
        wait_until(lambda: ray_nodes(ray_url), 120, "the Ray head", 0.5)
        joined = start(
            node_ns.exec(
                [str(ROOT / "armature"), "join", f"{head_ns.address}:{ports.gcs}",
                 "--node-rank", "1", "--token-file", str(token_file)]
            ),
            {**os.environ, "ARMATURE_VENV": sys.prefix},
            logs / "join.log",
        )  # fmt: skip
        stops.append(lambda: stop(joined, 40.0))
        wait_until(lambda: len(ray_nodes(ray_url)) == 2, 120, "node 1 to join", 0.5)
        ranks = {n["labels"].get(NODE_RANK_LABEL): n["node_ip"] for n in ray_nodes(ray_url)}
        assert ranks == {"0": head_ns.address, "1": node_ns.address}, ranks
        print(f"multi-node: head, node and control plane up in {time.monotonic() - began:.1f} s")
        yield Cluster(head_ns, node_ns, ray_url, stack.url, joined)
        began = time.monotonic()
    print(f"multi-node: everything stopped and removed in {time.monotonic() - began:.1f} s")


@pytest.fixture
def api(cluster, settings) -> APIClient:
    settings.RAY_ADDRESS = cluster.ray_url  # what the test itself asks Ray
    settings.RAY_AUTH_TOKEN = TOKEN
    settings.ARMATURE_WEB_URL = cluster.web_url  # where it tells browsers of state changes
    user = get_user_model().objects.create_user("olga")
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    create_experiment("multi-node", CONFIG)
    client = APIClient()
    client.force_authenticate(user)
    return client


def launch(api: APIClient, placement: str, nodes: int = 2) -> int:
    cluster = f"cluster={{num_nodes: {nodes}, component_placement: {placement}}}"
    created = api.post(
        "/api/v1/runs", {"experiment": "multi-node", "overrides": [*SMALL, cluster]}, format="json"
    )
    assert created.status_code == 201, created.json()
    return created.json()["id"]


def events(run_id: int, kind: str) -> list[RunEvent]:
    return list(RunEvent.objects.filter(run_id=run_id, kind=kind))


def state(run_id: int) -> str:
    return Run.objects.get(pk=run_id).state


def wait_for(run_id: int, states: set[str], timeout_s: float = 240) -> Run:
    wait_until(lambda: state(run_id) in states, timeout_s, f"run {run_id} to be {states}", 0.5)
    return Run.objects.get(pk=run_id)


def iterations(run_id: int) -> list[int]:
    """The iterations in the run's metrics.jsonl (complete lines only: it is being written)."""
    path = run_artifact_dir(run_id) / "metrics.jsonl"
    text = path.read_text() if path.exists() else ""
    return [json.loads(line)["iteration"] for line in text.splitlines(keepends=True)
            if line.endswith("\n")]  # fmt: skip


def reported_live(run_id: int, past: int = 0) -> bool:
    """The web server has iterations after `past` from the trainer while it runs."""
    run = Run.objects.get(pk=run_id)
    return run.state == "running" and run.progress_step >= past + 2


def checkpoint_of(run_id: int, iteration: int) -> Path:
    return run_artifact_dir(run_id) / "checkpoints" / f"iter_{iteration:06d}.pt"


def alive(pid: int) -> bool:
    try:
        return " Z " not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][:3]
    except FileNotFoundError:
        return False


def seconds_to(event: RunEvent, since: float) -> float:
    return round(event.created_at.timestamp() - since, 1)


def cancelled_and_stopped(run_id: int, stops: int) -> RunEvent:
    """The `stopped` event of a run whose cancel was asked, once the run is `cancelled`,
    its trainer has said it stopped (its `stops`th time) and its processes are gone."""
    wait_for(run_id, {"cancelled"}, 60)
    placed = [p["pid"] for p in events(run_id, "placed")[-1].data["processes"]]
    wait_until(lambda: not any(map(alive, placed)), 60, f"run {run_id}'s processes to go")
    wait_until(lambda: len(events(run_id, "stopped")) == stops, 60, f"run {run_id} stopped")
    return events(run_id, "stopped")[-1]


def resume_all(api: APIClient, runs: dict[str, int], stopped_at: dict[int, int], attempt: int):
    """Resume each run as its `attempt`th and see it report live past where it stopped,
    continued from its checkpoint: no gap, nothing redone."""
    began = time.monotonic()
    for run_id in runs.values():
        wait_until(lambda: Run.objects.get(pk=run_id).job_ended, 60, "the job seen ended")  # noqa: B023
        resumed = api.post(f"/api/v1/runs/{run_id}/resume")
        assert resumed.status_code == 202, resumed.json()
        assert resumed.json()["attempt"] == attempt
    for name, run_id in runs.items():
        past = stopped_at[run_id]
        wait_until(lambda: reported_live(run_id, past), 240, f"run {run_id} resumed", 0.5)  # noqa: B023
        assert events(run_id, "started")[-1].data["resume"] is True
        done = iterations(run_id)
        assert done == list(range(1, len(done) + 1)) and len(done) > past, (name, past, done)
        print(f"multi-node: {name}: resumed, live {time.monotonic() - began:.1f} s later")


@pytest.mark.django_db(transaction=True)
def test_placed_runs_run_where_placed_stop_with_a_checkpoint_resume_or_are_refused(cluster, api):
    """The three runs at once: their starts are most of the time."""
    began = time.monotonic()
    runs = {name: launch(api, placement) for name, placement in LAYOUTS.items()}
    # A placement the runtime cannot honour is refused, saying how to add the node.
    impossible = launch(api, "{actor: '0', env: '2'}", nodes=3)
    for name, run_id in runs.items():
        wait_until(lambda: events(run_id, "placed") or state(run_id) == "failed", 240,  # noqa: B023
                   f"run {run_id} ({name}) placed", 0.5)  # fmt: skip
        assert state(run_id) != "failed", Run.objects.get(pk=run_id).exit_reason
        processes = events(run_id, "placed")[0].data["processes"]
        assert {p["node_rank"] for p in processes} == {0, 1}, processes
        for process in processes:
            space = cluster.node if process["node_rank"] == 1 else cluster.head
            assert space.holds(process["pid"]), (name, process, space)
            assert process["node_ip"] == space.address, process
        wait_until(lambda: reported_live(run_id), 120, f"run {run_id} live", 0.5)  # noqa: B023
        print(f"multi-node: {name}: reporting live {time.monotonic() - began:.1f} s after launch")
    refused = wait_for(impossible, {"failed", "succeeded"})
    assert refused.state == "failed"
    assert "node rank 2 (components env) is not in the Ray cluster" in refused.exit_reason
    assert "--node-rank 2" in refused.exit_reason  # how to add that node

    # Stopping the app (Ctrl-C of `up`) interrupts the head's runs: each trainer saves a
    # checkpoint and says `stopped`; the runs can then be resumed.
    asked = time.time()
    interrupted = interrupt_active_runs("the control plane was stopped (test)", 40)
    assert sorted(interrupted) == sorted(runs.values())
    stopped_at = {}
    for name, run_id in runs.items():
        wait_for(run_id, {"interrupted"}, 30)
        (stopped,) = events(run_id, "stopped")
        stopped_at[run_id] = stopped.data["iteration"]
        assert stopped.data["signal"] == "SIGTERM"
        assert checkpoint_of(run_id, stopped_at[run_id]).exists(), name
        assert iterations(run_id) == list(range(1, stopped_at[run_id] + 1)), name
        print(f"multi-node: {name}: stopped {seconds_to(stopped, asked)} s after the app's stop")

    resume_all(api, runs, stopped_at, attempt=2)

    # Stop through the API: the trainers save a checkpoint the same way and say `stopped`
    # (a cancelled run takes its trainer's reports until its job ends), nothing of theirs
    # is left running on either node, and Resume continues from that checkpoint.
    asked = time.time()
    for run_id in runs.values():
        assert api.post(f"/api/v1/runs/{run_id}/cancel").status_code == 202
    for name, run_id in runs.items():
        stopped = cancelled_and_stopped(run_id, stops=2)
        stopped_at[run_id] = stopped.data["iteration"]
        assert checkpoint_of(run_id, stopped_at[run_id]).exists(), name
        assert iterations(run_id) == list(range(1, stopped_at[run_id] + 1)), name
        print(f"multi-node: {name}: cancel to `stopped` {seconds_to(stopped, asked)} s")
    resume_all(api, runs, stopped_at, attempt=3)
    for run_id in runs.values():
        assert api.post(f"/api/v1/runs/{run_id}/cancel").status_code == 202
    for run_id in runs.values():
        # Nothing of the runs writes to the database while pytest-django truncates it
        # (a trainer's last reports deadlocked with that TRUNCATE once).
        cancelled_and_stopped(run_id, stops=3)


def test_ctrl_c_takes_the_joined_node_out_leaving_none_of_its_processes(cluster):
    """Last of the tests on the cluster: node 1 leaves it."""
    marker = str(join.node_temp_dir(os.environ, 1))
    assert join.node_pids(marker)  # the node's raylet and workers, marked by join
    cluster.join.send_signal(signal.SIGINT)  # what Ctrl-C sends
    assert cluster.join.wait(60) == 0
    assert join.node_pids(marker) == []
    wait_until(lambda: len(ray_nodes(cluster.ray_url)) == 1, 60, "the head to see node 1 go")


def test_the_namespaces_and_their_processes_go_even_when_a_test_fails():
    reason = netns.unavailable()
    if reason:
        pytest.skip(reason)
    with pytest.raises(RuntimeError, match="a failing test"):
        with netns.namespaces(1) as bridge:
            (space,) = bridge.spaces
            sleeper = subprocess.Popen(space.exec(["sleep", "600"]), start_new_session=True)
            wait_until(lambda: sleeper.pid in space.pids(), 10, "the process in its namespace")
            assert netns.leftovers(bridge.tag)
            raise RuntimeError("a failing test")
    assert sleeper.wait(timeout=10) == -9  # killed by PID
    assert netns.leftovers(bridge.tag) == []
