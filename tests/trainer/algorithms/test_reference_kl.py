"""The KL anchor (`algorithm.kl_coef`): a per-token k3 KL to a frozen copy of the policy
the run started from, kept only when the coefficient is not 0."""

import copy
import math

import pytest
import torch

from tests.trainer.algorithms.test_policy_update import _params, _setup
from trainer.algorithms import GRPO
from trainer.algorithms.on_policy import CHUNK_INPUTS

torch.set_num_threads(1)


def _differing_groups(algorithm, batch):
    batch.episode_success[:] = torch.arange(batch.num_episodes) % 2 == 0
    return algorithm.compute_returns(batch)


def test_without_a_coefficient_no_reference_copy_is_kept():
    _, algorithm, batch = _setup(GRPO, with_critic=False, group_size=2, update_epochs=1)
    metrics = algorithm.update(_differing_groups(algorithm, batch))
    assert algorithm.reference is None
    assert "losses/kl_reference" not in metrics
    assert "reference" not in algorithm.state_dict()


def test_the_reference_is_the_frozen_starting_policy_and_its_kl_starts_at_zero():
    _, algorithm, batch = _setup(
        GRPO, with_critic=False, group_size=2, kl_coef=0.1, update_epochs=1, num_minibatches=1
    )
    start = _params(algorithm)
    batch = _differing_groups(algorithm, batch)
    metrics = algorithm.update(batch)
    assert metrics["losses/kl_reference"] == pytest.approx(0.0, abs=1e-6)
    reference = algorithm.reference
    assert reference is not None and reference is not algorithm.policy
    assert not any(p.requires_grad for p in reference.parameters())
    assert all(
        torch.equal(a, b.detach()) for a, b in zip(start, reference.parameters(), strict=True)
    )
    moved = _params(algorithm)
    assert not all(torch.equal(a, b) for a, b in zip(start, moved, strict=True))
    algorithm.update(batch)  # the reference stays where the run started
    assert all(
        torch.equal(a, b.detach()) for a, b in zip(start, reference.parameters(), strict=True)
    )
    # A resumed run anchors to the same start, not to where it resumed.
    state = copy.deepcopy(algorithm.state_dict())
    _, resumed, _ = _setup(GRPO, with_critic=False, group_size=2, kl_coef=0.1)
    resumed.load_state_dict(state)
    assert all(
        torch.equal(a, b.detach())
        for a, b in zip(start, resumed.reference.parameters(), strict=True)
    )


def test_the_penalty_is_the_token_mean_of_k3_against_the_reference():
    _, algorithm, batch = _setup(GRPO, with_critic=False, group_size=2, kl_coef=0.5)
    samples = _differing_groups(algorithm, batch).training_samples()
    with torch.no_grad():
        now, _ = algorithm.policy.token_log_probs(*(samples[n] for n in CHUNK_INPUTS))
    shifts = torch.linspace(-0.4, 0.6, 35).view(5, 7)
    samples["reference_log_prob"] = now - shifts
    anchored = copy.deepcopy(algorithm)
    stats = anchored._minibatch_step(dict(samples))
    # KL(policy || reference) from the policy's own tokens: r - 1 - log r with
    # log r = log p_ref - log p = -shift, a token-mean.
    expected = sum(math.exp(-s) - 1 + s for s in shifts.flatten().tolist()) / 35
    assert float(stats["losses/kl_reference"]) == pytest.approx(expected, rel=1e-4)
    # The penalty moves the step: the same minibatch without it steps elsewhere.
    free_algorithm = copy.deepcopy(algorithm)
    free_algorithm.settings.kl_coef = 0.0
    free_algorithm._minibatch_step(dict(samples))
    assert not all(
        torch.allclose(a, b)
        for a, b in zip(_params(anchored), _params(free_algorithm), strict=True)
    )
