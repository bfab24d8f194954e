"""The trainer's end of the link, against a scripted WebSocket server that records what
arrives and answers as each test says. (The control plane's real end is tested with
daphne in tests/controlplane/runs/test_trainer_reports_live.py.)"""

import json
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from websockets.http11 import Response
from websockets.sync.server import ServerConnection, serve

from tests.processes import free_port, wait_until
from trainer.commands.run import run
from trainer.link.client import TrainerLink, websocket_url
from trainer.link.environment import NullLink, link_from_env
from trainer.link.spool import Spool

torch.set_num_threads(1)
EXAMPLE = str(Path(__file__).resolve().parents[3] / "examples" / "builtin_ppo.yaml")
SMALL = [
    "env.num_parallel_envs=4",
    "algorithm.data_batch_size=8",
    "runner.progress=false",
    "algorithm.update_epochs=1",
    "algorithm.num_minibatches=2",
    "runner.torch_threads=1",
]
Answer = Callable[[int, dict], dict | None]


def ack(connection_index: int, message: dict) -> dict | None:
    return {"type": "ack", "seq": message["seq"]}


class ScriptedServer:
    """Records every message per connection; `answer(connection_index, message)` gives the
    reply (None: no reply; {"close": True}: drop the connection)."""

    def __init__(self, answer: Answer = ack, reject_status: int | None = None, port: int = 0):
        self.answer = answer
        self.reject_status = reject_status
        self.connections: list[list[dict]] = []
        self.requests: list[tuple[str, str | None]] = []
        self.server = serve(self._handle, "127.0.0.1", port, process_request=self._check)
        self.url = f"http://127.0.0.1:{self.server.socket.getsockname()[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _check(self, connection: ServerConnection, request) -> Response | None:
        self.requests.append((request.path, request.headers.get("Authorization")))
        if self.reject_status is not None:
            return connection.respond(self.reject_status, "refused\n")
        return None

    def _handle(self, connection: ServerConnection) -> None:
        received: list[dict] = []
        self.connections.append(received)
        index = len(self.connections) - 1
        for raw in connection:
            message = json.loads(raw)
            received.append(message)
            reply = self.answer(index, message)
            if reply == {"close": True}:
                return
            if reply is not None:
                connection.send(json.dumps(reply))

    def by_seq(self) -> dict[int, dict]:
        """Every distinct message, by seq; asserts a resend repeats its message exactly."""
        messages: dict[int, dict] = {}
        for received in self.connections:
            for message in received:
                assert messages.setdefault(message["seq"], message) == message
        return messages

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def servers():
    started: list[ScriptedServer] = []

    def make(**kwargs) -> ScriptedServer:
        started.append(ScriptedServer(**kwargs))
        return started[-1]

    yield make
    for server in started:
        server.close()


def test_without_the_variables_the_link_does_nothing(caplog):
    assert isinstance(link_from_env({}), NullLink)
    assert isinstance(link_from_env({"ARMATURE_URL": "http://127.0.0.1:1"}), NullLink)
    assert "ARMATURE_RUN_ID, ARMATURE_RUN_TOKEN not set" in caplog.text
    bad_id = {"ARMATURE_URL": "http://x", "ARMATURE_RUN_ID": "seven", "ARMATURE_RUN_TOKEN": "t"}
    assert isinstance(link_from_env(bad_id), NullLink)
    assert NullLink().close() is True


def test_the_url_becomes_the_runs_websocket_endpoint():
    assert websocket_url("http://127.0.0.1:8000/", 7) == "ws://127.0.0.1:8000/ws/trainer/7/"
    assert websocket_url("https://cp.example/armature", 7) == (
        "wss://cp.example/armature/ws/trainer/7/"
    )


def test_it_presents_the_token_and_numbers_messages_from_one(servers):
    server = servers()
    link = TrainerLink(server.url, 7, "tok")
    link.event("started", {"name": "x"})
    link.metrics(1, {"rollout/success_rate": 0.5, "losses/value_loss": float("nan")}, at=12.5)
    link.progress(1, 3)
    assert link.close(timeout=20) is True
    assert server.requests[0] == ("/ws/trainer/7/", "Bearer tok")
    assert list(server.by_seq().values()) == [
        {"v": 1, "type": "event", "seq": 1, "kind": "started", "data": {"name": "x"}},
        # NaN has no JSON form: the value is left out, the batch still goes.
        {"v": 1, "type": "metrics", "seq": 2, "step": 1, "time": 12.5,
         "values": {"rollout/success_rate": 0.5}},
        {"v": 1, "type": "progress", "seq": 3, "step": 1, "total": 3},
    ]  # fmt: skip


def test_unacknowledged_messages_are_resent_after_a_reconnect(servers):
    def first_connection_acks_only_seq_1(index: int, message: dict) -> dict | None:
        if index > 0 or message["seq"] == 1:
            return ack(index, message)
        return {"close": True} if message["seq"] == 3 else None

    server = servers(answer=first_connection_acks_only_seq_1)
    link = TrainerLink(server.url, 7, "tok")
    for step in (1, 2, 3):
        link.progress(step, 10)
    wait_until(lambda: len(server.connections) >= 2, 30, "a second connection")
    link.progress(4, 10)
    assert link.close(timeout=20) is True
    resent = [message["seq"] for message in server.connections[1]]
    assert {2, 3, 4} <= set(resent)
    assert sorted(server.by_seq()) == [1, 2, 3, 4]


def test_a_message_the_server_rejects_is_not_kept(servers):
    def reject_seq_1(index: int, message: dict) -> dict:
        if message["seq"] == 1:
            return {"type": "error", "seq": 1, "error": "no"}
        return ack(index, message)

    server = servers(answer=reject_seq_1)
    link = TrainerLink(server.url, 7, "tok")
    link.progress(1, 2)
    link.progress(2, 2)
    assert link.close(timeout=20) is True
    assert len(server.connections) == 1


def test_a_refused_handshake_stops_the_link_for_good(servers):
    server = servers(reject_status=403)
    link = TrainerLink(server.url, 7, "wrong")
    wait_until(lambda: link.refused is not None, 30, "the refusal")
    link.progress(1, 2)  # ignored, and never blocks
    assert link.pending() == 0
    assert link.close(timeout=30) is False
    assert len(server.requests) == 1  # no retries against a refusal


def test_without_a_spool_the_buffer_is_bounded_while_the_control_plane_is_away():
    link = TrainerLink(f"http://127.0.0.1:{free_port()}", 7, "tok", max_pending=10)
    for step in range(25):
        link.progress(step, 25)
    assert link.pending() == 10 and link.dropped == 15
    assert link.close(timeout=0) is False


def test_with_a_spool_memory_stays_bounded_and_nothing_is_dropped(tmp_path, servers):
    port = free_port()
    link = TrainerLink(
        f"http://127.0.0.1:{port}", 7, "tok", max_pending=10, max_backoff_s=0.2,
        spool=Spool(tmp_path, attempt=1, key="k"),
    )  # fmt: skip
    for step in range(1, 501):  # the control plane is away all along
        link.progress(step, 500)
    assert link.pending() == 500 and link.dropped == 0
    assert sum(p is not None for p in link._pending.values()) == 10  # the rest on disk only
    assert len((tmp_path / "attempt-1.jsonl").read_text().splitlines()) == 500
    server = servers(port=port)  # the control plane comes (back) up
    assert link.close(timeout=60) is True
    assert sorted(server.by_seq()) == list(range(1, 501))  # in order, none lost
    assert [m["step"] for _, m in sorted(server.by_seq().items())] == list(range(1, 501))
    assert not (tmp_path / "attempt-1.jsonl").exists()  # all acknowledged: nothing left


def test_what_is_unacknowledged_at_exit_stays_in_the_spool_and_a_restart_continues_it(
    tmp_path, servers
):
    down = f"http://127.0.0.1:{free_port()}"
    first = TrainerLink(down, 7, "tok", spool=Spool(tmp_path, attempt=2, key="k"))
    for step in (1, 2, 3):
        first.progress(step, 9)
    assert first.close(timeout=0.2) is False
    spooled = (tmp_path / "attempt-2.jsonl").read_text().splitlines()
    assert [json.loads(line.split(" ", 1)[1])["seq"] for line in spooled] == [1, 2, 3]

    server = servers()
    second = TrainerLink(server.url, 7, "tok", spool=Spool(tmp_path, attempt=2, key="k"))
    second.progress(4, 9)  # numbered after the first process's messages
    assert second.close(timeout=30) is True
    assert sorted(server.by_seq()) == [1, 2, 3, 4]


def _run_cli(tmp_path, monkeypatch, url: str | None, *extra: str) -> int:
    if url is None:
        for name in ("ARMATURE_URL", "ARMATURE_RUN_ID", "ARMATURE_RUN_TOKEN"):
            monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv("ARMATURE_URL", url)
        monkeypatch.setenv("ARMATURE_RUN_ID", "7")
        monkeypatch.setenv("ARMATURE_RUN_TOKEN", "tok")
        monkeypatch.setenv("ARMATURE_LINK_FLUSH_S", "1")
    return run([EXAMPLE, *SMALL, f"runner.output_dir={tmp_path}", *extra])


def _metrics_without_timing(path) -> list[dict]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [{k: v for k, v in line.items() if not k.startswith("charts/")} for line in lines]


def test_the_run_command_reports_its_run_and_trains_as_it_does_alone(
    tmp_path, monkeypatch, servers
):
    server = servers()
    # No videos: their events come from the recorder's thread, in no fixed place.
    arguments = ["runner.iterations=2", "runner.checkpoint_every=1", "runner.videos.every=0"]
    assert _run_cli(tmp_path / "linked", monkeypatch, server.url, *arguments) == 0
    assert _run_cli(tmp_path / "alone", monkeypatch, None, *arguments) == 0
    assert _metrics_without_timing(tmp_path / "linked" / "metrics.jsonl") == (
        _metrics_without_timing(tmp_path / "alone" / "metrics.jsonl")
    )
    messages = server.by_seq()
    assert sorted(messages) == list(range(1, len(messages) + 1))
    shape = [(m["type"], m.get("kind") or m.get("step")) for m in messages.values()]
    assert shape == [
        ("event", "started"),
        ("event", "placed"),
        ("event", "model"),
        ("metrics", 1), ("progress", 1), ("event", "checkpoint"),
        ("metrics", 2), ("progress", 2), ("event", "checkpoint"),
        ("event", "finished"),
    ]  # fmt: skip
    finished = messages[len(messages)]["data"]
    assert finished["iteration"] == 2 and "rollout/success_rate" in finished["summary"]
    assert messages[6]["data"]["path"].endswith("iter_000001.pt")


def test_a_config_error_is_reported_as_failed(tmp_path, monkeypatch, servers):
    server = servers()
    assert _run_cli(tmp_path, monkeypatch, server.url, "env.task_ids=[0, 9]") == 2
    messages = list(server.by_seq().values())
    # The config parsed, so the run had started; the env then refused the task id.
    assert [m["kind"] for m in messages] == ["started", "placed", "failed"]
    failed = messages[-1]
    assert "env.task_ids[1]: builtin_reach has tasks 0..5, not 9" in failed["data"]["error"]


def test_training_finishes_when_the_control_plane_is_unreachable(tmp_path, monkeypatch, capsys):
    closed_port = f"http://127.0.0.1:{free_port()}"
    assert _run_cli(tmp_path, monkeypatch, closed_port, "runner.iterations=2") == 0
    assert "finished 2/2 iterations" in capsys.readouterr().out
