"""One schema for both ends of the link: what the trainer builds with
trainer/link/protocol.py, the control plane accepts, and it refuses the rest with an
error naming the field."""

import json

import pytest

from controlplane.runs import telemetry
from trainer.evaluation.protocol import EvalTable, TaskResult
from trainer.link import protocol
from trainer.link.reporter import eval_summary, failure_data


def wire(message: protocol.Event | protocol.Metrics | protocol.Progress) -> dict:
    return telemetry.parse_message(message.payload())


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


def eval_table(tasks: int = 2) -> dict:
    results = [
        TaskResult(t, f"KITCHEN_SCENE{t}_put_the_black_bowl_on_top_of_the_cabinet", 150, t % 7,
                   {5: [t % 3, 50], 10: [t % 2, 50], 15: [t % 2, 50]})
        for t in range(tasks)
    ]  # fmt: skip
    return EvalTable("libero", "libero_90", "/runs/run-3/checkpoints/iter_000060.pt", 60,
                     [5, 10, 15], results).to_json()  # fmt: skip


def test_an_evaluation_table_and_a_recovery_are_accepted():
    for tasks in (1, 90):  # LIBERO-90's 90 tasks fit in one event
        table = eval_table(tasks)
        assert wire(protocol.Event(seq=1, kind="evaluated", data=table))["data"] == table
        summary = eval_summary(table)
        assert wire(protocol.Event(seq=2, kind="finished", data={"summary": summary}))
    recovered = protocol.Event(seq=3, kind="recovered", data={"iteration": 4, "what": "worker"})
    assert wire(recovered)["kind"] == "recovered"


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda t: t["tasks"][1].update(successes=151), "data.tasks.1: successes must not exceed"),
        (lambda t: t["tasks"][0].update(rate=1.5), "data.tasks.0.rate: Input should be less"),
        (lambda t: t.update(tasks=[]), "data.tasks: List should have at least 1 item"),
        (lambda t: t["horizon_average"].update(h5=0.1), "data.horizon_average.h5.[key]"),
        (lambda t: t.pop("average"), "data.average: Field required"),
        (lambda t: t.update(extra=1), "data.extra: Extra inputs are not permitted"),
    ],
)
def test_a_malformed_evaluation_table_is_refused_naming_the_field(change, error):
    table = eval_table()
    change(table)
    frame = json.dumps({"v": 1, "type": "event", "seq": 4, "kind": "evaluated", "data": table})
    with pytest.raises(telemetry.InvalidMessage) as refused:
        telemetry.parse_message(frame)
    assert error in refused.value.error


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


@pytest.mark.parametrize(
    ("frame", "error"),
    [
        ('{"v":1,"type":"metrics","seq":3,"step":1,"time":1,"values":{"a":NaN}}',
         "values.a: Input should be a finite number"),
        ('{"v":1,"type":"metrics","seq":3,"step":1,"time":1,"values":{"a":1e999}}',
         "values.a: Input should be a finite number"),
        ('{"v":1,"type":"metrics","seq":3,"step":1,"time":1,"values":{}}', "values:"),
        ('{"v":1,"type":"metrics","seq":3,"step":true,"time":1,"values":{"a":1}}', "step:"),
        ('{"v":1,"type":"event","seq":4,"kind":"finished","data":{}}', "data.summary"),
        ('{"v":1,"type":"event","seq":4,"kind":"finished","data":{"summary":{"x":"1"}}}',
         "data.summary.x"),
        ('{"v":2,"type":"progress","seq":5,"step":1,"total":1,"z":1}',
         "v: Input should be 1; z: Extra inputs are not permitted"),
        ('{"v":1,"type":"progress","seq":5,"step":3,"total":2}', "step must not exceed total"),
        ('{"v":1,"type":"nope","seq":6}', "does not match any of the expected tags"),
        ('{"v":1,"type":"event","seq":7,"kind":"started","data":{"x":Infinity}}',
         "finite numbers"),
    ],
)  # fmt: skip
def test_malformed_messages_are_refused_naming_the_field(frame, error):
    with pytest.raises(telemetry.InvalidMessage) as refused:
        telemetry.parse_message(frame)
    assert error in refused.value.error
    assert refused.value.seq == json.loads(frame.replace("NaN", "0").replace("Infinity", "0")
                                           .replace("1e999", "0"))["seq"]  # fmt: skip
