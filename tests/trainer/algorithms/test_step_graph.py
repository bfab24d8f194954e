"""The on-policy update's graphed minibatch steps, on the CPU: the same fixed, padded
tables a GPU's replays are fed, run eagerly (tests/gpu replays them from CUDA graphs)."""

import copy
from pathlib import Path

import pytest
import torch

from tests.device_guard import DeviceGuard
from tests.trainer.algorithms.test_policy_update import _params, _setup
from trainer.algorithms import GRPO, PPO
from trainer.algorithms.step_graph import WARMUP_STEPS, GraphedSteps, padded_rows
from trainer.config import load_config
from trainer.runner.build import settings_from_config

torch.set_num_threads(1)


def test_padded_sizes_add_at_most_an_eighth_and_few_sizes_cover_a_range():
    for rows in range(1, 5000):
        size = padded_rows(rows)
        assert rows <= size <= rows + max(0, rows // 8)
        assert padded_rows(size) == size
    # A run whose minibatches hold 900-1100 rows captures a handful of sizes.
    assert len({padded_rows(rows) for rows in range(900, 1101)}) == 3
    assert padded_rows(24_576) == 24_576  # Isaac Lab's 4096 x 24 in 4: no padding


def _pair(cls, **settings):
    """Two copies of one algorithm and batch: one plain, one stepping through the fixed
    tables."""
    _, plain, batch = _setup(cls, num_envs=40, **settings)
    tabled = copy.deepcopy(plain)
    tabled.step_graphs = GraphedSteps(tabled, capture=False)
    return plain, tabled, batch


GRPO_SETTINGS = {"update_epochs": 2, "num_minibatches": 3, "group_size": 2, "with_critic": False}


@pytest.mark.parametrize(
    ("cls", "settings", "masked"),
    [
        (PPO, {"update_epochs": 3, "num_minibatches": 3, "entropy_coef": 0.01}, False),
        (GRPO, GRPO_SETTINGS, False),
        (GRPO, GRPO_SETTINGS, True),  # the group filter's masked groups weigh nothing
        # per-token ratios and the KL anchor: their columns padded with the rest
        (GRPO, {**GRPO_SETTINGS, "ratio": "token", "kl_coef": 0.1, "clip_ratio_high": 0.28}, True),
    ],
)
def test_steps_on_padded_fixed_tables_compute_what_plain_steps_do(cls, settings, masked):
    plain, tabled, batch = _pair(cls, **settings)
    if cls is GRPO:  # groups that differ: advantages to learn from
        batch.episode_success[:] = torch.arange(40) % 4 == 0
        batch = plain.compute_returns(batch)
    if masked:
        batch = batch.with_loss_mask((torch.arange(40) // 2 % 3 != 0).float())
    assert batch.advantage.abs().sum() > 0
    rows = batch.training_samples()["weight"].shape[0]
    minibatch = rows // settings["num_minibatches"]
    assert padded_rows(minibatch) > minibatch, "the test needs padding rows"
    for _ in range(2):
        expected = plain.update(batch)
        with DeviceGuard() as guard:  # every table and index made on the device
            got = tabled.update(batch)
        assert guard.found == []
        assert got.keys() == expected.keys()
        for key in expected:
            assert got[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-7), key
    for a, b in zip(_params(plain), _params(tabled), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    graphs = tabled.step_graphs
    assert graphs.eager_steps == WARMUP_STEPS and graphs.steps  # then the tables
    assert tabled.optimizer_steps == plain.optimizer_steps


def test_padding_rows_weigh_nothing_even_when_they_copy_a_weighty_row():
    plain, tabled, batch = _pair(PPO, update_epochs=1, num_minibatches=3)
    tabled.step_graphs.eager_steps = WARMUP_STEPS  # straight to the tables
    tabled.update(batch)
    step = next(iter(tabled.step_graphs.steps.values()))
    weights = step.inputs["weight"]
    real = int((weights > 0).sum())
    assert 0 < real < weights.shape[0]
    assert torch.equal(weights[real:], torch.zeros(weights.shape[0] - real))
    # the padding repeats a real row: finite inputs, whatever the policy makes of them
    assert torch.equal(
        step.inputs["obs"][real:], step.inputs["obs"][:1].expand_as(step.inputs["obs"][real:])
    )


def test_the_tables_stand_aside_where_a_step_must_ask_the_device():
    """An early stop takes the plain path: whether to step at all is read from the
    device there."""
    _, tabled, batch = _pair(PPO, update_epochs=2, num_minibatches=2, target_kl=1e9)
    tabled.update(batch)
    assert tabled.step_graphs.eager_steps == 0 and not tabled.step_graphs.steps


def test_a_minibatch_that_weighs_nothing_takes_no_step_on_the_tables_either():
    """Masked groups only: the optimizer is told on the device to skip the step, so a
    replay skips it as an eager step does, and Adam's state stays as it was."""
    _, tabled, batch = _pair(GRPO, **{**GRPO_SETTINGS, "num_minibatches": 2})
    batch.episode_success[:] = torch.arange(40) % 4 == 0
    batch = tabled.compute_returns(batch)
    tabled.step_graphs.eager_steps = WARMUP_STEPS  # straight to the tables
    first = _params(tabled)
    tabled.update(batch)  # Adam has a state to keep, and the policy moved
    assert not all(torch.equal(a, b) for a, b in zip(first, _params(tabled), strict=True))
    before = _params(tabled), copy.deepcopy(tabled.optimizer.state_dict()["state"])
    metrics = tabled.update(batch.with_loss_mask(torch.zeros(40)))
    assert tabled.step_graphs.steps  # the steps ran on the tables
    # Steps taken, no statistics: no rows of this update said anything.
    assert set(metrics) == {"losses/updates", "losses/early_stopped", "policy/std"}
    assert metrics["losses/updates"] == 4.0
    assert all(torch.equal(a, b) for a, b in zip(before[0], _params(tabled), strict=True))
    state = tabled.optimizer.state_dict()["state"]
    for key, saved in before[1].items():
        for name, tensor in saved.items():
            assert torch.equal(tensor, state[key][name]), name


def test_loading_a_checkpoint_forgets_the_tables_built_for_the_old_state():
    plain, tabled, batch = _pair(PPO, update_epochs=3, num_minibatches=2)
    tabled.update(batch)
    assert tabled.step_graphs.steps
    tabled.load_state_dict(plain.state_dict())
    assert not tabled.step_graphs.steps and tabled.step_graphs.eager_steps == 0


def test_the_config_key_reaches_the_algorithm_and_a_cpu_run_has_no_graphs():
    example = Path(__file__).resolve().parents[3] / "examples" / "builtin_grpo.yaml"
    assert settings_from_config(load_config(example)).cuda_graph
    settings = settings_from_config(load_config(example, ["algorithm.cuda_graph=false"]))
    assert not settings.cuda_graph
    _, algorithm, _ = _setup(PPO, update_epochs=1)  # on the CPU: nothing to capture
    assert algorithm.step_graphs is None
