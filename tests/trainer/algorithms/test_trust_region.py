"""The clipped ratio of an executed chunk: per token with a token-mean loss and separate
lower and upper clips, the chunk's geometric mean clipped in log space by the token
count, and the statistics that say why an update moves the policy or not."""

import math

import pytest
import torch

from tests.trainer.algorithms.test_policy_update import _setup
from trainer.algorithms import GRPO
from trainer.algorithms.on_policy import CHUNK_INPUTS, recompute_token_log_probs
from trainer.algorithms.trust_region import (
    ClipRange,
    clipped_surrogate,
    k3,
    per_step_statistics,
)

torch.set_num_threads(1)

CHUNK, DIMS = 5, 7  # _setup's chunk and action dims: 35 tokens a chunk
TOKENS = CHUNK * DIMS
# One chunk's per-token log-ratios, the same for every row: from -0.5 to 0.5.
SHIFTS = torch.linspace(-0.5, 0.5, TOKENS).view(CHUNK, DIMS)


def _token_samples(algorithm, batch, shifts=SHIFTS):
    """Training rows whose rollout log-probs are the current policy's minus `shifts` per
    token, with advantages of both signs and several sizes."""
    samples = batch.training_samples()
    with torch.no_grad():
        now, _ = algorithm.policy.token_log_probs(*(samples[n] for n in CHUNK_INPUTS))
    samples["token_log_prob"] = now - shifts
    samples["log_prob"] = samples["token_log_prob"].sum((1, 2))
    rows = samples["advantage"].shape[0]
    samples["advantage"] = torch.tensor([(1.0 + i % 3) * (-1) ** i for i in range(rows)])
    return samples


def _hand_surrogate(advantage: float, shifts: torch.Tensor, low: float, high: float) -> float:
    """One row's token-mean clipped surrogate, token by token in plain floats."""
    total = 0.0
    for shift in shifts.flatten().tolist():
        ratio = math.exp(shift)
        clipped = min(max(ratio, 1 - low), 1 + high)
        total += max(-advantage * ratio, -advantage * clipped)
    return total / shifts.numel()


def test_the_token_ratio_loss_is_the_token_mean_of_each_tokens_clipped_surrogate():
    _, algorithm, batch = _setup(
        GRPO, with_critic=False, group_size=2, ratio="token", clip_ratio_low=0.2,
        clip_ratio_high=0.28,
    )  # fmt: skip
    samples = _token_samples(algorithm, batch)
    stats = algorithm._minibatch_step(samples)
    advantages = samples["advantage"].tolist()
    expected = sum(_hand_surrogate(a, SHIFTS, 0.2, 0.28) for a in advantages) / len(advantages)
    assert float(stats["losses/policy_loss"]) == pytest.approx(expected, rel=1e-5)
    shifts = SHIFTS.flatten().tolist()
    low = sum(s < math.log(0.8) for s in shifts) / TOKENS
    high = sum(s > math.log(1.28) for s in shifts) / TOKENS
    assert 0 < low != high > 0  # clip-higher: the two sides clip different shares
    assert float(stats["losses/clip_fraction_low"]) == pytest.approx(low)
    assert float(stats["losses/clip_fraction_high"]) == pytest.approx(high)
    assert float(stats["losses/clip_fraction"]) == pytest.approx(low + high)
    # KL per token (what target_kl reads in this mode) and per chunk (whose shifts sum to 0)
    per_token = sum(math.exp(s) - 1 - s for s in shifts) / TOKENS
    assert float(stats["losses/approx_kl"]) == pytest.approx(per_token, rel=1e-4)
    assert float(stats["losses/approx_kl_token"]) == pytest.approx(per_token, rel=1e-4)
    assert float(stats["losses/approx_kl_chunk"]) == pytest.approx(0.0, abs=1e-4)
    mean_abs = sum(abs(s) for s in shifts) / TOKENS
    assert float(stats["losses/abs_log_ratio_token"]) == pytest.approx(mean_abs, rel=1e-4)


def test_the_per_token_clip_bounds_each_token_where_the_chunk_ratio_lets_it_move():
    # One chunk of three tokens: doubled, nudged, halved. Their product is 1.105, well
    # inside the chunk's clip range; per token, the doubled one is past 1 + 0.28.
    log_ratio = torch.tensor([[math.log(2.0), 0.1, math.log(0.5)]], requires_grad=True)
    clip = ClipRange(low=0.2, high=0.28)
    for advantage, frozen in ((1.0, 0), (-1.0, 2)):
        log_ratio.grad = None
        surrogate = clipped_surrogate(log_ratio, torch.tensor([advantage]), clip)
        surrogate.loss.sum().backward()
        grad = log_ratio.grad[0]
        # The token whose clipped term wins gets no gradient; the others get -A r / 3.
        assert grad[frozen] == 0.0
        for token in {0, 1, 2} - {frozen}:
            ratio = math.exp(float(log_ratio.detach()[0, token]))
            assert float(grad[token]) == pytest.approx(-advantage * ratio / 3, rel=1e-6)
        assert float(surrogate.clipped_high[0]) == pytest.approx(1 / 3)
        assert float(surrogate.clipped_low[0]) == pytest.approx(1 / 3)
    chunk = log_ratio.detach().sum(1, keepdim=True)  # the same tokens as one chunk ratio
    as_chunk = clipped_surrogate(chunk.squeeze(1), torch.tensor([1.0]), clip)
    assert float(as_chunk.clipped_high[0]) == float(as_chunk.clipped_low[0]) == 0.0


def test_the_geometric_mean_is_clipped_in_log_space_by_the_chunks_range_over_its_tokens():
    _, algorithm, batch = _setup(GRPO, with_critic=False, group_size=2, ratio="geometric_mean")
    samples = batch.training_samples()
    for chunk_ratio, clipped in ((1.35, 1.0), (1.1, 0.0), (0.75, 1.0)):
        moved = dict(samples, log_prob=samples["log_prob"] - math.log(chunk_ratio))
        stats = algorithm._minibatch_step(moved)
        assert float(stats["losses/clip_fraction"]) == clipped, chunk_ratio
        # the symmetric clip_ratio (0.2) where no lower and upper clips are set
        side = "high" if chunk_ratio > 1 else "low"
        assert float(stats[f"losses/clip_fraction_{side}"]) == clipped
        chunk_kl = chunk_ratio - 1 - math.log(chunk_ratio)  # per chunk in this mode
        assert float(stats["losses/approx_kl"]) == pytest.approx(chunk_kl, rel=1e-4)
        assert float(stats["losses/approx_kl_chunk"]) == pytest.approx(chunk_kl, rel=1e-4)
        assert "losses/approx_kl_token" not in stats  # no per-token rollout log-probs here
    clip = ClipRange(low=0.2, high=0.28)
    low, high = clip.log_bounds(TOKENS)
    assert low == pytest.approx(math.log(0.8) / TOKENS)
    assert high == pytest.approx(math.log(1.28) / TOKENS)
    # A chunk ratio of 1.35 over 35 tokens: a geometric mean of 1.0086, inside 1 ± 0.2
    # as one token's ratio, yet the chunk is past 1 + 0.28: clipped, no gradient.
    chunk_log_ratio = torch.tensor([math.log(1.35)], requires_grad=True)
    surrogate = clipped_surrogate(chunk_log_ratio / TOKENS, torch.tensor([1.0]), clip, TOKENS)
    surrogate.loss.sum().backward()
    assert chunk_log_ratio.grad[0] == 0.0 and float(surrogate.clipped_high[0]) == 1.0
    assert float(surrogate.loss.detach()[0]) == pytest.approx(-(1.28 ** (1 / TOKENS)))


def test_the_update_recomputes_each_tokens_rollout_log_prob_and_starts_at_ratio_one():
    _, algorithm, batch = _setup(
        GRPO, with_critic=False, group_size=2, ratio="token", update_epochs=1, num_minibatches=1
    )
    batch.episode_success[:] = torch.arange(8) % 2 == 0  # groups that differ
    batch = algorithm.compute_returns(batch)
    samples = batch.training_samples()
    tokens = recompute_token_log_probs(algorithm.policy, samples, parts=3)
    assert tokens.shape == (samples["log_prob"].shape[0], CHUNK, DIMS)
    torch.testing.assert_close(tokens.sum((1, 2)), samples["log_prob"], rtol=0, atol=1e-4)
    metrics = algorithm.update(batch)  # one step, its statistics from before it
    assert metrics["losses/approx_kl_token"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["losses/clip_fraction_low"] == metrics["losses/clip_fraction_high"] == 0.0
    assert metrics["losses/abs_log_ratio_token"] == pytest.approx(0.0, abs=1e-5)


def test_each_action_dims_token_entropy_is_reported():
    _, algorithm, batch = _setup(GRPO, with_critic=False, group_size=2)
    with torch.no_grad():
        algorithm.policy.log_std.copy_(torch.linspace(-1.0, 0.0, DIMS))
    stats = algorithm._minibatch_step(batch.training_samples())
    for dim in range(DIMS):
        log_std = float(algorithm.policy.log_std.detach()[dim])
        expected = 0.5 + 0.5 * math.log(2 * math.pi) + log_std  # a Gaussian's, per token
        assert float(stats[f"policy/entropy_dim{dim}"]) == pytest.approx(expected, rel=1e-5)
    assert float(stats["losses/entropy"]) == pytest.approx(
        sum(float(stats[f"policy/entropy_dim{d}"]) for d in range(DIMS)) * CHUNK, rel=1e-5
    )  # the chunk's entropy: every token's


def test_k3_is_r_minus_one_minus_log_r_and_never_negative():
    log_ratio = torch.tensor([-2.0, -0.1, 0.0, 0.1, 2.0])
    expected = log_ratio.exp() - 1 - log_ratio
    torch.testing.assert_close(k3(log_ratio), expected)
    assert (k3(torch.linspace(-30, 30, 101)) >= 0).all()
    assert torch.isfinite(k3(torch.tensor([1e4]))).all()  # bounded before exp


def test_tokens_laid_out_per_step_report_each_steps_kl_and_clip_fraction():
    """[rows, steps · chunk, dims] step-major: step 1 of row 0 moved past the clip in
    half its tokens, everything else stayed at ratio 1."""
    log_ratio = torch.zeros(2, 3 * 4, 2)  # 2 rows, 3 steps of a 4-action chunk, 2 dims
    log_ratio[0, 4:8, 0] = 0.5  # row 0, step 1, dim 0: beyond log(1.2)
    clip = ClipRange(0.2, 0.2)
    statistics = per_step_statistics(log_ratio, 3, clip)
    assert sorted(statistics) == sorted(f"losses/{name}_step{k}" for k in range(3)
                                        for name in ("approx_kl", "clip_fraction"))  # fmt: skip
    assert statistics["losses/clip_fraction_step1"].tolist() == [0.5, 0.0]
    assert statistics["losses/clip_fraction_step0"].tolist() == [0.0, 0.0]
    kl = statistics["losses/approx_kl_step1"]
    torch.testing.assert_close(kl, torch.tensor([0.5 * k3(torch.tensor(0.5)).item(), 0.0]))
    assert statistics["losses/approx_kl_step2"].tolist() == [0.0, 0.0]
    assert per_step_statistics(log_ratio, 1, clip) == {}


def test_a_masked_row_whose_chunk_ratio_overflows_leaves_the_loss_finite():
    log_ratio = torch.tensor([200.0, 0.1], requires_grad=True)  # exp(200) is inf in fp32
    surrogate = clipped_surrogate(log_ratio, torch.tensor([0.0, 1.0]), ClipRange(0.2, 0.2))
    loss = surrogate.loss @ torch.tensor([0.0, 1.0])  # the first row weighs nothing
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(log_ratio.grad).all()
