"""RLPD's learner: the cta_ratio schedule, targets, temperature, and that it learns."""

import math

import pytest
import torch

from trainer.algorithms.rlpd import (
    CriticEnsemble,
    EnsembleLayerNorm,
    RLPDLearner,
    RLPDSettings,
    TanhGaussianActor,
)

OBS, ACT = 3, 2


def batch(rows: int = 32, terminal: bool = False) -> dict:
    return {
        "obs": torch.randn(rows, OBS),
        "action": torch.rand(rows, ACT) * 2 - 1,
        "reward": torch.randn(rows),
        "next_obs": torch.randn(rows, OBS),
        "terminal": torch.full((rows,), terminal),
    }


def learner(precision: str = "fp32", **overrides) -> RLPDLearner:
    torch.manual_seed(0)
    settings = RLPDSettings(hidden_sizes=(32, 32), **overrides)
    return RLPDLearner(OBS, ACT, settings, precision=precision)


def snapshot(module_or_param) -> list[torch.Tensor]:
    if isinstance(module_or_param, torch.nn.Parameter):
        return [module_or_param.detach().clone()]
    return [p.detach().clone() for p in module_or_param.parameters()]


def changed(before: list[torch.Tensor], after: list[torch.Tensor]) -> bool:
    return any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_cta_ratio_updates_the_critic_alone_then_everything():
    rlpd = learner(cta_ratio=3)
    parts = {
        "critic": rlpd.critic,
        "target": rlpd.target_critic,
        "actor": rlpd.actor,
        "temperature": rlpd.log_temperature,
    }
    seen: list[set[str]] = []
    state = {name: snapshot(part) for name, part in parts.items()}

    def sample() -> dict:  # called before each sub-update: records what the last changed
        if seen or any(changed(state[n], snapshot(p)) for n, p in parts.items()):
            seen.append({n for n, p in parts.items() if changed(state[n], snapshot(p))})
        else:
            seen.append(set())
        state.update({name: snapshot(part) for name, part in parts.items()})
        return batch()

    metrics = rlpd.update(sample)
    seen.append({n for n, p in parts.items() if changed(state[n], snapshot(p))})
    # seen[0]: before anything; then after critic-only, critic-only, joint.
    assert seen == [set(), {"critic", "target"}, {"critic", "target"}, set(parts)]
    assert rlpd.updates == 3
    assert {"rlpd/critic_loss", "rlpd/actor_loss", "rlpd/temperature", "rlpd/entropy"} <= set(
        metrics
    )


def test_the_actors_pass_adds_no_gradient_to_the_critic():
    rlpd = learner(cta_ratio=1)
    after_critic_loss: dict[str, torch.Tensor] = {}
    critic_step = rlpd.critic_optimizer.step

    def record_then_step(*args, **kwargs):
        after_critic_loss.update({n: p.grad.clone() for n, p in rlpd.critic.named_parameters()})
        return critic_step(*args, **kwargs)

    rlpd.critic_optimizer.step = record_then_step
    rlpd.update(batch)
    for name, parameter in rlpd.critic.named_parameters():
        torch.testing.assert_close(parameter.grad, after_critic_loss[name])
    assert all(p.requires_grad for p in rlpd.critic.parameters())


def test_targets_move_by_the_polyak_step():
    rlpd = learner(tau=0.25)
    target_before = snapshot(rlpd.target_critic)
    rlpd.critic_step(batch())
    for old, online, new in zip(
        target_before, rlpd.critic.parameters(), rlpd.target_critic.parameters(), strict=True
    ):
        torch.testing.assert_close(new, 0.75 * old + 0.25 * online.detach())


def test_terminal_transitions_do_not_bootstrap_and_time_outs_do():
    rlpd = learner(discount=0.9)
    done, cut = batch(terminal=True), batch(terminal=False)
    cut["reward"] = done["reward"]
    torch.testing.assert_close(rlpd.td_target(done), done["reward"])
    assert not torch.allclose(rlpd.td_target(cut), cut["reward"])


def test_the_temperature_rises_when_entropy_is_too_low_and_falls_when_too_high():
    rlpd = learner()
    target = rlpd.target_entropy  # -1 for two action dimensions
    for log_prob, direction in ((-target + 3.0, +1), (-target - 3.0, -1)):
        before = rlpd.temperature
        rlpd.temperature_step(torch.full((8,), log_prob))
        assert (rlpd.temperature - before) * direction > 0


def test_the_temperatures_step_takes_its_losss_own_gradient():
    rlpd, autograd = learner(), learner()
    log_prob = torch.randn(64) - 1.0
    for _ in range(3):
        loss = rlpd.temperature_step(log_prob)
        # The loss written out and differentiated by autograd, as SAC implementations do.
        expected = -(autograd.log_temperature.exp() * (log_prob + autograd.target_entropy)).mean()
        autograd.temperature_optimizer.zero_grad()
        expected.backward()
        torch.testing.assert_close(rlpd.log_temperature.grad, autograd.log_temperature.grad)
        torch.testing.assert_close(loss, expected.detach())
        autograd.temperature_optimizer.step()
        torch.testing.assert_close(rlpd.log_temperature, autograd.log_temperature)


def test_the_squashed_log_probability_matches_a_numeric_change_of_variables():
    torch.manual_seed(1)
    actor = TanhGaussianActor(OBS, 1, (8,))
    obs = torch.randn(4000, OBS)
    obs[:] = obs[0]  # one state: the actions are draws from one distribution
    torch.manual_seed(2)
    actions, log_prob = actor.sample(obs)
    torch.manual_seed(2)
    assert torch.equal(actor.sample(obs, with_log_prob=False)[0], actions)  # the same draw
    mean, log_std = actor(obs[:1])
    raw = torch.atanh(actions.clamp(-0.999999, 0.999999))
    normal = torch.distributions.Normal(mean[0, 0], log_std[0, 0].exp())
    expected = normal.log_prob(raw[:, 0]) - torch.log1p(-actions[:, 0].pow(2))
    torch.testing.assert_close(log_prob, expected, atol=2e-3, rtol=1e-3)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_it_learns_the_best_action_of_a_continuous_bandit(precision):
    """One-step episodes rewarded -|a - goal|²: the actor's mean goes to the goal, with
    the networks' forward passes in bf16 too (weights, targets and losses in fp32)."""
    rlpd = learner(
        precision,
        cta_ratio=2, discount=0.0, critic_ensemble=4, actor_lr=1e-3, critic_lr=1e-3,
        init_temperature=0.05,
    )  # fmt: skip
    goal = torch.tensor([0.5, -0.3])
    generator = torch.Generator().manual_seed(2)

    def sample() -> dict:
        actions = torch.rand(64, ACT, generator=generator) * 2 - 1
        return {
            "obs": torch.zeros(64, OBS),
            "action": actions,
            "reward": -(actions - goal).pow(2).sum(-1),
            "next_obs": torch.zeros(64, OBS),
            "terminal": torch.ones(64, dtype=torch.bool),
        }

    for _ in range(600):
        metrics = rlpd.update(sample)
    assert all(value.dtype == torch.float32 for value in metrics.values())
    assert all(p.dtype == torch.float32 for p in rlpd.critic.parameters())
    best = rlpd.actor.act(torch.zeros(1, OBS), deterministic=True)[0]
    assert torch.allclose(best, goal, atol=0.15), best


def test_a_snapshot_continues_identically(tmp_path):
    first, second = learner(), learner(init_temperature=0.5)
    first.update(batch)
    torch.save(first.state_dict(), tmp_path / "learner.pt")
    second.load_state_dict(torch.load(tmp_path / "learner.pt"))
    data = [batch() for _ in range(4)]
    torch.manual_seed(5)
    a = [first.update(iter(data[i : i + 2]).__next__) for i in (0, 2)]
    torch.manual_seed(5)
    b = [second.update(iter(data[i : i + 2]).__next__) for i in (0, 2)]
    assert a == b and second.updates == first.updates
    assert not changed(snapshot(first.actor), snapshot(second.actor))


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="cta_ratio"):
        RLPDSettings(cta_ratio=0)
    with pytest.raises(ValueError, match="critic_subsample"):
        RLPDSettings(critic_ensemble=2, critic_subsample=3)
    assert math.isclose(learner(init_temperature=0.1).temperature, 0.1, rel_tol=1e-6)


def test_image_observations_train_through_each_networks_own_encoder():
    """Without `shared_encoder` (the shared one: tests/trainer/algorithms/test_rlpd_pixels.py)."""
    torch.manual_seed(0)
    shape = (3, 16, 16)
    settings = RLPDSettings(hidden_sizes=(32, 32), cta_ratio=1, tau=0.5, shared_encoder=False)
    rlpd = RLPDLearner(shape, ACT, settings)

    def frames() -> dict:  # uint8, as the replay buffers keep camera frames
        return {
            **batch(16),
            "obs": torch.randint(0, 256, (16, *shape), dtype=torch.uint8),
            "next_obs": torch.randint(0, 256, (16, *shape), dtype=torch.uint8),
        }

    encoders = {
        "actor": rlpd.actor.encoder, "critic": rlpd.critic.encoder,
        "target": rlpd.target_critic.encoder,
    }  # fmt: skip
    before = {name: snapshot(encoder) for name, encoder in encoders.items()}
    metrics = rlpd.update(frames)
    assert all(math.isfinite(value) for value in metrics.values())
    assert all(changed(before[name], snapshot(e)) for name, e in encoders.items())
    # The target's encoder follows the critic's by the Polyak step, not by gradients.
    for old, online, new in zip(
        before["target"], encoders["critic"].parameters(), encoders["target"].parameters(),
        strict=True,
    ):  # fmt: skip
        torch.testing.assert_close(new, 0.5 * old + 0.5 * online.detach())
    # The policy acts on the env's float frames too.
    assert rlpd.actor.act(torch.rand(4, *shape)).shape == (4, ACT)


def test_observations_that_are_neither_vectors_nor_images_are_refused():
    with pytest.raises(ValueError, match=r"state vectors or \[C, H, W\] images, not shape"):
        RLPDLearner((4, 4), ACT, RLPDSettings(hidden_sizes=(8,)))


def test_each_critic_member_has_its_own_layer_norm():
    critics = learner(critic_ensemble=10).critic
    norms = [m for m in critics.modules() if isinstance(m, EnsembleLayerNorm)]
    assert len(norms) == 2
    assert all(n.weight.shape == n.bias.shape == (10, 1, 32) for n in norms)
    # Reference: each member normalised on its own with its own scale and bias.
    norm = norms[0]
    with torch.no_grad():
        norm.weight.uniform_(0.5, 2.0)
        norm.bias.normal_()
    x = torch.randn(10, 5, 32)
    expected = torch.stack(
        [torch.nn.functional.layer_norm(x[e], (32,), norm.weight[e, 0], norm.bias[e, 0])
         for e in range(10)]
    )  # fmt: skip
    assert torch.allclose(norm(x), expected, atol=1e-6)
    # A loss on member 3 alone moves only member 3's scale.
    critics.zero_grad()
    critics(torch.randn(4, OBS), torch.rand(4, ACT))[3].sum().backward()
    touched = norms[1].weight.grad.abs().sum(dim=(1, 2)) > 0
    assert touched.tolist() == [e == 3 for e in range(10)]


def test_a_critic_saved_with_one_shared_layer_norm_still_loads():
    critics = CriticEnsemble((OBS,), ACT, 4, (8,), layer_norm=True)
    state = critics.state_dict()
    state["net.1.weight"], state["net.1.bias"] = torch.full((8,), 2.0), torch.full((8,), 0.5)
    critics.load_state_dict(state)
    assert torch.equal(critics.net[1].weight, torch.full((4, 1, 8), 2.0))
    assert torch.equal(critics.net[1].bias, torch.full((4, 1, 8), 0.5))


def test_update_rounds_are_paid_for_per_stored_transition():
    """RLPD's update-to-data ratio is per transition: `updates_per_step` rounds per
    `num_envs` stored rows, however many copies are still in their episode. With 8
    copies and 2 rounds per step of all of them, hand-computed: 8 rows pay 2 rounds;
    then 3 + 3 + 2 rows pay 0.75, 1.5 (one round, 0.5 owed) and 2.0 (the second)."""
    from trainer.algorithms.rlpd_algorithm import RLPDAlgorithm
    from trainer.config.schema import RLPDConfig

    rlpd = RLPDConfig(
        batch_size=4, demo_fraction=0.0, training_starts=0, updates_per_step=2, cta_ratio=2
    )
    algorithm = RLPDAlgorithm(
        (OBS,), ACT, RLPDSettings(hidden_sizes=(8,), cta_ratio=2, critic_ensemble=2),
        rlpd, num_envs=8, generator=torch.Generator().manual_seed(0),
    )  # fmt: skip

    def rows(count):
        return {
            "obs": torch.randn(count, OBS), "action": torch.rand(count, ACT) * 2 - 1,
            "reward": torch.zeros(count), "next_obs": torch.randn(count, OBS),
            "terminal": torch.zeros(count, dtype=torch.bool),
            "intervened": torch.zeros(count, dtype=torch.bool),
        }  # fmt: skip

    rounds = []
    for count in (8, 3, 3, 2):
        algorithm.take_step(rows(count))
        rounds.append(algorithm.learner.updates // 2)  # cta_ratio critic updates a round
    assert rounds == [2, 2, 3, 4]
    assert algorithm.owed_updates == pytest.approx(0.0)
    algorithm.take_step(rows(1))
    assert algorithm.learner.updates // 2 == 4 and algorithm.owed_updates == pytest.approx(0.25)
