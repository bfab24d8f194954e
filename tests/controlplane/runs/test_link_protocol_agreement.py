"""The trainer's protocol module and the control plane's validator are two copies of one
protocol (the control plane may not import the trainer's link): they must agree."""

import json

import pytest

from controlplane.runs import telemetry
from trainer.link import protocol
from trainer.link.reporter import failure_data


def test_the_constants_agree():
    assert telemetry.PROTOCOL_VERSION == protocol.PROTOCOL_VERSION
    assert telemetry.EVENT_KINDS == set(protocol.EVENT_KINDS)
    assert telemetry.MAX_VALUES_PER_MESSAGE == protocol.MAX_VALUES_PER_MESSAGE
    assert telemetry.MAX_KEY_LENGTH == protocol.MAX_KEY_LENGTH
    assert telemetry.MAX_EVENT_DATA_CHARS == protocol.MAX_EVENT_DATA_CHARS


def wire(message: protocol.Message) -> dict:
    return telemetry.parse_message(json.dumps(message.to_json(), allow_nan=False))


def test_what_the_trainer_builds_the_control_plane_accepts():
    values = {f"rollout/success_rate_task_{i}": i / 2500 for i in range(2500)}
    values |= {"losses/value_loss": float("nan"), "k" * 201: 1.0, "charts/SPS": 10}
    chunks = protocol.metric_chunks(values)
    assert [len(chunk) for chunk in chunks] == [1000, 1000, 501]
    for seq, chunk in enumerate(chunks, start=1):
        assert wire(protocol.Metrics(seq=seq, step=3, time=1.7e9, values=chunk))["seq"] == seq
    assert wire(protocol.Progress(seq=9, step=3, total=60))["total"] == 60
    summary = protocol.finite_values({"rollout/success_rate": 0.5, "x": float("inf")})
    finished = protocol.Event(seq=10, kind="finished", data={"summary": summary})
    assert wire(finished)["data"] == {"summary": {"rollout/success_rate": 0.5}}
    data = protocol.json_safe({"error": "x", "loss": float("nan"), "shape": (1, 2)})
    assert wire(protocol.Event(seq=11, kind="failed", data=data))["data"] == {
        "error": "x", "loss": None, "shape": [1, 2],
    }  # fmt: skip


def test_a_failure_report_fits_the_event_size_limit():
    try:
        raise RuntimeError("x" * 100_000)
    except RuntimeError as error:
        data = failure_data(error)
    assert wire(protocol.Event(seq=1, kind="failed", data=data))["kind"] == "failed"


@pytest.mark.parametrize(
    "reply",
    [{"type": "ack"}, {"type": "ack", "seq": "1"}, {"type": "hello", "seq": 1}, [1], None],
)
def test_the_trainer_ignores_replies_it_does_not_understand(reply):
    parsed = protocol.parse_reply(reply)
    assert parsed is None or parsed.seq is None
