"""Learning is the test: the example configs must solve the built-in env.

Each run takes seconds on 2 CPU cores; the seeds are fixed, so a failure here is a
regression in the env, the models or the algorithms, not bad luck.
"""

from pathlib import Path

import pytest
import torch

from trainer.config import load_config
from trainer.runner.on_policy_runner import OnPolicyRunner

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[3]


def _learn(tmp_path, example, *overrides):
    config = load_config(
        REPO / "examples" / example,
        [f"runner.output_dir={tmp_path}", "runner.progress=false", *overrides],
    )
    return OnPolicyRunner(config).learn()


def _mean(history, key):
    return sum(metrics[key] for metrics in history) / len(history)


@pytest.mark.parametrize(
    ("example", "overrides"),
    [
        ("builtin_ppo.yaml", ()),
        ("builtin_grpo.yaml", ()),
        ("builtin_grpo.yaml", ("algorithm.name=rloo",)),
    ],
    ids=["ppo", "grpo", "rloo"],
)
def test_the_example_reaches_a_high_success_rate_from_a_failing_start(tmp_path, example, overrides):
    history = _learn(tmp_path, example, *overrides)
    first, last = history[:6], history[-6:]  # six iterations cover all six tasks once
    assert _mean(first, "rollout/success_rate") < 0.3
    assert _mean(last, "rollout/success_rate") >= 0.8
    for horizon in (5, 10, 15):
        assert _mean(last, f"rollout/plan_success_rate_h{horizon}") >= 0.7
