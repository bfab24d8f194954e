import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.algorithms import PPO, OnPolicySettings
from trainer.envs import BuiltinReachEnv
from trainer.models import (
    ChunkedPolicy,
    GaussianChunkPolicy,
    PlanCache,
    ValueCritic,
    assign_horizons,
    build_encoder,
)
from trainer.models.plan_cache import SpareCaches
from trainer.runner.collection import run_round

torch.set_num_threads(1)


def test_horizons_are_assigned_cyclically_over_the_batch():
    assert assign_horizons([5, 10, 15], 7).tolist() == [5, 10, 15, 5, 10, 15, 5]


def _cache_with_counting_plans(horizons, chunk=5, max_horizon=15):
    cache = PlanCache(torch.tensor(horizons), chunk, max_horizon)
    made = []

    def replan():
        which, _, _ = cache.replan_slots()
        if not which.numel():
            return
        # plan[i, k] = 100 * plan number + k, so every slice shows where it came from
        plans = torch.arange(max_horizon, dtype=torch.float32).repeat(len(which), 1)
        plans = (plans + 100 * (len(made) + 1))[:, :, None].repeat(1, 1, 2)
        # the log-prob of a chunk: the sum of its actions' first values / 1000
        cache.store(which, plans, plans[:, :, 0].view(len(which), -1, chunk).sum(2) / 1000)
        mask = torch.zeros(len(horizons), dtype=torch.bool)
        mask[which] = True
        made.append(mask)

    return cache, made, replan


def test_a_slot_replans_when_its_offset_reaches_its_horizon():
    cache, made, replan = _cache_with_counting_plans([5, 10, 15])
    offsets = []
    for _ in range(6):
        replan()
        draw = cache.next_chunk()
        offsets.append(draw.offsets.tolist())
    assert offsets == [[0, 0, 0], [0, 5, 5], [0, 0, 10], [0, 5, 0], [0, 0, 5], [0, 5, 10]]
    replanned = torch.stack(made).int().tolist()
    assert replanned == [[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 0, 1], [1, 1, 0], [1, 0, 0]]


def test_the_executed_chunk_is_the_plan_sliced_at_the_offset():
    cache, _, replan = _cache_with_counting_plans([15])
    replan()
    chunks = [cache.next_chunk() for _ in range(3)]
    assert chunks[1].actions[0, :, 0].tolist() == [105.0, 106.0, 107.0, 108.0, 109.0]
    assert chunks[2].log_prob.item() == pytest.approx(sum(range(110, 115)) / 1000)
    assert [chunk.offsets.tolist() for chunk in chunks] == [[0], [5], [10]]
    assert chunks[2].horizons.tolist() == [15]


def test_plans_of_one_chunk_each_are_the_chunks_themselves():
    """Every horizon the chunk: each decision's plans are what the slots execute, handed
    over as they are (no copy into the cache, no selection out of it)."""
    cache = PlanCache(torch.tensor([5, 5, 5]), 5, 15)
    for decision in range(3):
        which, which_horizons, plan_steps = cache.replan_slots()
        assert which.tolist() == [0, 1, 2] and plan_steps == 5
        plans = torch.full((3, 5, 2), float(decision))
        chunk_log_probs = torch.tensor([[1.0], [2.0], [3.0]]) * decision
        cache.store(which, plans, chunk_log_probs)
        draw = cache.next_chunk()
        assert draw.actions is plans
        assert draw.log_prob.tolist() == [decision, 2.0 * decision, 3.0 * decision]
        assert draw.offsets.tolist() == [0, 0, 0]
    assert cache.plans is None  # nothing was ever copied in
    with pytest.raises(RuntimeError, match="need a new plan"):
        cache.next_chunk()


def test_a_new_round_restarts_every_slot_and_keeps_the_schedule():
    cache, made, replan = _cache_with_counting_plans([5, 10, 15])
    for _ in range(4):
        replan()
        cache.next_chunk()
    assert cache.same_schedule(torch.tensor([5, 10, 15]), 5, 15)
    assert not cache.same_schedule(torch.tensor([5, 10, 10]), 5, 15)
    assert not cache.same_schedule(torch.tensor([5, 10, 15]), 5, 20)
    phases = dict(cache._phases)
    cache.restart()
    replan()
    draw = cache.next_chunk()
    assert made[-1].tolist() == [True, True, True]
    assert draw.offsets.tolist() == [0, 0, 0]
    assert draw.actions[:, 0, 0].tolist() == [500.0, 500.0, 500.0]  # the fifth plans
    assert cache._phases.keys() == phases.keys()  # nothing worked out twice


def test_plans_stop_at_the_longest_horizon_among_the_replanning_slots():
    cache = PlanCache(torch.tensor([5, 10, 15, 5]), 5, 15)
    steps_per_decision = []
    for _ in range(6):
        which, _, plan_steps = cache.replan_slots()
        steps_per_decision.append(plan_steps)
        plans = torch.arange(plan_steps, dtype=torch.float32).repeat(len(which), 1)[:, :, None]
        cache.store(which, plans, plans[:, :, 0].view(len(which), -1, 5).sum(2))
        draw = cache.next_chunk()
        # every slot still gets its own chunk: [offset, ..., offset + 4]
        assert torch.equal(draw.actions[:, 0, 0], draw.offsets.float())
        assert torch.equal(draw.log_prob, 5 * draw.offsets.float() + 10)
    assert steps_per_decision == [15, 5, 10, 15, 10, 5]
    with pytest.raises(ValueError, match="plans of 7 steps: use a multiple of 5 up to 15"):
        cache.store(torch.tensor([0]), torch.zeros(1, 7, 1), torch.zeros(1, 1))


def test_acting_without_a_plan_and_bad_horizons_are_errors():
    cache = PlanCache(torch.tensor([5, 10]), 5, 10)
    with pytest.raises(RuntimeError, match="need a new plan"):
        cache.next_chunk()
    cache.store(torch.tensor([0, 1]), torch.zeros(2, 10, 7), torch.zeros(2, 2))
    cache.next_chunk()
    with pytest.raises(RuntimeError, match="need a new plan"):
        cache.next_chunk()  # slot 0 (H=5) must replan at the second decision
    with pytest.raises(ValueError, match="multiple of the chunk size 5"):
        PlanCache(torch.tensor([5, 7]), 5, 10)
    with pytest.raises(ValueError, match="max horizon 10"):
        PlanCache(torch.tensor([15]), 5, 10)
    with pytest.raises(ValueError, match="max horizon 12 must be a multiple of 5"):
        PlanCache(torch.tensor([10]), 5, 12)


def _policy(kind, obs_shape, action_dim=8):
    encoder = build_encoder(kind, obs_shape, (32, 32))
    return GaussianChunkPolicy(
        encoder, action_dim=action_dim, env_action_dim=7, max_horizon=15, init_log_std=-0.3
    )


# bf16: the network's products round to 8 bits of mantissa, and a row's product may
# round differently in a batch of another size; sampling and log-probs are float32.
TOLERANCE = {"fp32": 1e-5, "bf16": 2e-2}


@pytest.mark.parametrize("pattern", [[5, 10, 15], [5]])  # [5]: every plan one chunk
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_training_recomputes_exactly_the_rollout_log_probs(precision, pattern):
    """Through the real rollout path: the plan cache, the storage (which finds each
    row's plan observation from its offset) and the algorithm's round."""
    torch.manual_seed(0)
    env = BuiltinReachEnv(num_envs=6, max_episode_steps=20)
    policy = _policy("mlp", env.obs_shape)
    assert isinstance(policy, ChunkedPolicy)
    algorithm = PPO(policy, None, OnPolicySettings(), chunk=5, precision=precision)
    horizons = assign_horizons(pattern, 6)
    # 40-step episodes of 20 actions: some end early (success), every slot replans
    batch = run_round(env, algorithm, 0, list(range(6)), horizons, num_steps=4)
    valid = batch.valid
    assert {int(o) for o in batch.chunk_offset[valid]} == set(range(0, max(pattern), 5))
    with algorithm.autocast():
        log_prob, entropy = policy.chunk_log_prob(
            batch.plan_obs[valid],
            batch.plan_horizon[valid],
            batch.chunk_offset[valid],
            batch.actions[valid],
        )
    assert log_prob.dtype == torch.float32
    assert torch.allclose(log_prob, batch.log_prob[valid], atol=TOLERANCE[precision], rtol=0)
    assert log_prob.requires_grad
    per_dim = 0.5 + 0.5 * torch.log(torch.tensor(2 * torch.pi)) + policy.log_std[:7]
    assert torch.allclose(entropy, 5 * per_dim.sum().expand(len(log_prob)), atol=1e-5)


def test_each_row_is_trained_on_the_observation_its_plan_was_made_from():
    env = BuiltinReachEnv(num_envs=3, max_episode_steps=15)
    algorithm = PPO(_policy("mlp", env.obs_shape), None, OnPolicySettings(), chunk=5)
    batch = run_round(env, algorithm, 0, [0, 1, 2], assign_horizons([5, 10, 15], 3), 3)
    obs = batch.obs
    for t in range(3):
        for slot, horizon in enumerate([5, 10, 15]):
            made_at = t - (t % (horizon // 5))
            assert torch.equal(batch.plan_obs[t, slot], obs[made_at, slot])
    assert batch.plan_horizon.tolist() == [[5, 10, 15]] * 3


def test_the_extra_model_dims_are_never_sent_nor_counted():
    torch.manual_seed(1)
    policy = _policy("mlp", (19,), action_dim=9)
    obs = torch.randn(4, 19)
    horizons = torch.tensor([5, 10, 15, 5])
    plan, step_log_probs = policy.sample_plan(obs, horizons)
    changed = plan.clone()
    changed[..., 7:] += 50.0
    offsets = torch.zeros(4, dtype=torch.long)
    original, _ = policy.chunk_log_prob(obs, horizons, offsets, plan[:, :5])
    moved, _ = policy.chunk_log_prob(obs, horizons, offsets, changed[:, :5])
    assert torch.allclose(original, moved)
    assert torch.allclose(original, step_log_probs[:, :5].sum(1), atol=1e-5)


def test_a_shorter_plan_is_the_start_of_the_full_plan():
    torch.manual_seed(3)
    policy = _policy("mlp", (19,))
    obs, horizons = torch.randn(3, 19), torch.tensor([5, 10, 5])
    full, full_log_probs = policy.sample_plan(obs, horizons, deterministic=True)
    short, short_log_probs = policy.sample_plan(obs, horizons, deterministic=True, steps=10)
    assert short.shape == (3, 10, 8) and short_log_probs.shape == (3, 10)
    assert torch.equal(short, full[:, :10])
    assert torch.equal(short_log_probs, full_log_probs[:, :10])
    sampled, log_probs = policy.sample_plan(obs, horizons, steps=10, chunk=5)
    assert log_probs.shape == (3, 2)
    for k in range(2):
        offsets = torch.full((3,), 5 * k)
        chunk = sampled[:, 5 * k : 5 * k + 5]
        recomputed, _ = policy.chunk_log_prob(obs, horizons, offsets, chunk)
        assert torch.allclose(recomputed, log_probs[:, k], atol=1e-5)
    with pytest.raises(ValueError, match="plan of 10 steps does not split into chunks of 3"):
        policy.sample_plan(obs, horizons, steps=10, chunk=3)


def test_a_cnn_policy_and_critic_work_on_camera_images():
    torch.manual_seed(2)
    obs_shape = (3, 32, 32)
    policy = _policy("cnn", obs_shape, action_dim=7)
    critic = ValueCritic(build_encoder("cnn", obs_shape, (32,)), (32,), max_horizon=15)
    obs = torch.rand(4, *obs_shape)
    horizons = torch.tensor([10, 5, 10, 5])
    cache = PlanCache(horizons, 5, 15)
    plan, chunk_log_probs = policy.sample_plan(obs, horizons, chunk=5)
    cache.store(torch.arange(4), plan, chunk_log_probs)
    draw = cache.next_chunk()
    log_prob, _ = policy.chunk_log_prob(obs, draw.horizons, draw.offsets, draw.actions)
    assert torch.allclose(log_prob, draw.log_prob, atol=1e-5)
    assert critic(obs, draw.horizons, draw.offsets).shape == (4,)


def test_mismatched_models_are_rejected():
    with pytest.raises(ValueError, match="predicts 6 action dims but the env needs 7"):
        GaussianChunkPolicy(build_encoder("mlp", (19,), (8,)), 6, 7, 15)
    with pytest.raises(ValueError, match="flat observations"):
        build_encoder("mlp", (3, 8, 8), (8,))
    with pytest.raises(ValueError, match="unknown model kind 'rnn'"):
        build_encoder("rnn", (3,), (8,))
    with pytest.raises(ValueError, match="unknown activation 'gelu'"):
        build_encoder("mlp", (3,), (8,), activation="gelu")


@settings(max_examples=50, deadline=None)
@given(
    chunk=st.integers(1, 4),
    multiples=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    batch=st.integers(1, 9),
    steps=st.integers(1, 20),
)
def test_every_slot_walks_its_plan_in_chunks_and_replans_at_its_horizon(
    chunk, multiples, batch, steps
):
    pattern = [chunk * m for m in multiples]
    horizons = assign_horizons(pattern, batch)
    cache = PlanCache(horizons, chunk, max(pattern))
    for step in range(steps):
        which, which_horizons, plan_steps = cache.replan_slots()
        expected = (step * chunk) % horizons
        assert torch.equal(which, (expected == 0).nonzero().squeeze(1))
        assert torch.equal(which_horizons, horizons[which])
        if which.numel():
            # plans only as long as the longest horizon among the replanning slots
            assert plan_steps == int(which_horizons.max())
            plans = torch.full((len(which), plan_steps, 2), float(step))
            cache.store(which, plans, torch.zeros(len(which), plan_steps // chunk))
        draw = cache.next_chunk()
        assert torch.equal(draw.offsets, expected)
        # each slot executes the plan it made at its last replanning decision
        made_at = step - (step % (horizons // chunk))
        assert torch.equal(draw.actions[:, 0, 0], made_at.float())


def test_rounds_of_shifted_horizons_keep_one_cache_per_schedule_never_shared():
    # Groups take the pattern's horizons in turn over the run, so rounds may alternate
    # between schedules: each keeps its cache (its phases worked out once).
    spare = SpareCaches()
    first, shifted = torch.tensor([5, 5, 10, 10]), torch.tensor([10, 10, 5, 5])
    a = spare.cache_for_round(None, first, 5, 10, "cpu")
    a.replan_slots()
    a.decision = 3
    b = spare.cache_for_round(a, shifted, 5, 10, "cpu")
    assert b is not a
    assert spare.cache_for_round(b, first, 5, 10, "cpu") is a
    assert a.decision == 0 and a._phases  # restarted, its schedule kept
    assert spare.cache_for_round(a, first, 5, 10, "cpu") is a
    # A rollout that starts from none (a pipeline stage) never gets a cache in use.
    assert spare.cache_for_round(None, first, 5, 10, "cpu") is not a
    assert spare.cache_for_round(None, shifted, 5, 10, "cpu") is b  # b was given up
    assert spare.cache_for_round(None, shifted, 5, 10, "cpu") is not b
