"""Metric keys on the trainer's side of the link: every key a run reports is in the
protocol's safe set (METRIC_KEY_RULE), a key outside it is left out of a message with
one warning instead of getting the whole message refused, and a LIBERO-90 run's keys
fit well under the per-run cap."""

import json
import logging
from collections import Counter
from pathlib import Path

import pytest
import torch

from trainer.algorithms.metrics import rates_from_counts
from trainer.commands.run import run
from trainer.link import protocol
from trainer.link.protocol import MAX_METRIC_KEYS_PER_RUN, finite_values, is_metric_key, json_safe

torch.set_num_threads(1)
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
SMALL = [
    "runner.iterations=2", "runner.progress=false", "runner.torch_threads=1",
    "env.num_parallel_envs=4",
]  # fmt: skip


@pytest.mark.parametrize(
    ("example", "extra"),
    [
        ("builtin_ppo.yaml", ["algorithm.data_batch_size=8", "algorithm.update_epochs=1",
                              "algorithm.num_minibatches=2"]),
        ("builtin_rlpd.yaml", ["env.interventions.source=scripted",
                               "env.interventions.share=0.5"]),
    ],
)  # fmt: skip
def test_every_key_a_run_reports_is_a_metric_key(tmp_path, monkeypatch, example, extra):
    for name in ("ARMATURE_URL", "ARMATURE_RUN_ID", "ARMATURE_RUN_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    assert run([str(EXAMPLES / example), *SMALL, *extra, f"runner.output_dir={tmp_path}"]) == 0
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    keys = set().union(*(json.loads(line) for line in lines))
    assert any(key.startswith("counts/task") for key in keys)
    assert [key for key in keys if not is_metric_key(key)] == []


def test_a_libero_90_run_makes_far_fewer_keys_than_the_cap():
    """Per task, per horizon and per task × horizon: the counts and rates of 90 tasks
    at 4 planning horizons, each cell seen."""
    counts: Counter[str] = Counter(episodes=720.0, successes=360.0, return_sum=1.0,
                                   length_sum=1.0, decisions=1.0)  # fmt: skip
    horizons = (5, 10, 15, 20)
    for task in range(90):
        counts[f"task{task}_success_count"], counts[f"task{task}_total_count"] = 4.0, 8.0
        for horizon in horizons:
            counts[f"task{task}/h{horizon}_success_count"] = 1.0
            counts[f"task{task}/h{horizon}_total_count"] = 2.0
    for horizon in horizons:
        counts[f"plan_h{horizon}_success_count"], counts[f"plan_h{horizon}_total_count"] = 90, 180
    keys = rates_from_counts(counts)
    assert [key for key in keys if not is_metric_key(key)] == []
    print(f"LIBERO-90 at 4 horizons: {len(keys)} keys from the counts (cap "
          f"{MAX_METRIC_KEYS_PER_RUN})")  # fmt: skip
    assert len(keys) + 100 < MAX_METRIC_KEYS_PER_RUN / 3  # room for the others, many times


def test_a_key_outside_the_safe_set_is_left_out_with_one_warning(caplog, monkeypatch):
    monkeypatch.setattr(protocol, "_warned_keys", set())
    caplog.set_level(logging.WARNING, "trainer.link.protocol")
    values = {"losses/value_loss": 0.5, "task<b>/x": 1.0, "a b": 2.0, "x\x00": 3.0}
    assert finite_values(values) == {"losses/value_loss": 0.5}
    assert finite_values(values) == {"losses/value_loss": 0.5}
    (warning,) = [r.getMessage() for r in caplog.records]  # once, not per message
    assert warning.startswith(f"link: metric keys left out ({protocol.METRIC_KEY_RULE}): ")
    assert "'task<b>/x', 'a b', 'x\\x00'" in warning


def test_event_data_is_made_storable_so_a_failure_report_still_goes():
    data = json_safe({"error": "boom\x00", "path\udcff": (1, 2**70, float("nan"))})
    assert data == {"error": "boom\ufffd", "path\ufffd": [1, str(2**70), None]}
    deep: dict = {}
    for _ in range(100):
        deep = {"a": deep}
    event = protocol.Event(seq=1, kind="failed", data=json_safe({"error": "x", "deep": deep}))
    assert protocol.parse_message(event.payload()).kind == "failed"
