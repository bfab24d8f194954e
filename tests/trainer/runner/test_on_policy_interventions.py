"""Interventions in on-policy runs (PPO, GRPO): the steps a human chose are flagged and
left out of the policy-gradient loss, since the policy did not draw those actions; the
value loss still learns from them."""

import pytest
import torch

from trainer.config.loading import load_config
from trainer.envs.intervention import InterventionEnv
from trainer.runner.on_policy_runner import OnPolicyRunner

ONE_STEP = [
    "actor.model.num_action_chunks=1",
    "rollout.action_horizons_pattern=[1]",
    "env.task_ids=[0]",
    "env.num_parallel_envs=8",
    "algorithm.data_batch_size=8",
    "algorithm.update_epochs=1",
    "algorithm.num_minibatches=1",
    "algorithm.target_kl=null",
    "runner.progress=false",
    "runner.torch_threads=1",
]


def runner(tmp_path, *overrides: str, algorithm: str = "ppo") -> OnPolicyRunner:
    config = load_config(
        "examples/builtin_ppo.yaml",
        [*ONE_STEP, f"algorithm.name={algorithm}", f"runner.output_dir={tmp_path}",
         "runner.iterations=1", *overrides],
    )  # fmt: skip
    return OnPolicyRunner(config, output_dir=tmp_path)


def parameters(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def test_a_human_chose_every_step_the_policy_is_left_alone_the_critic_learns(tmp_path):
    run = runner(tmp_path, "env.interventions.source=scripted", "env.interventions.share=1.0")
    try:
        assert isinstance(run.env, InterventionEnv)
        policy, critic = parameters(run.algorithm.policy), parameters(run.algorithm.critic)
        (metrics,) = run.learn()
    finally:
        run.close()
    assert metrics["interventions/rate"] == 1.0 and metrics["interventions/episodes"] == 8
    assert metrics["rollout/success_rate"] == 1.0  # the operator steers to the goal
    after = parameters(run.algorithm.policy)
    assert all(torch.equal(a, b) for a, b in zip(policy, after, strict=True))
    after = parameters(run.algorithm.critic)
    assert not all(torch.equal(a, b) for a, b in zip(critic, after, strict=True))


def test_rows_a_human_chose_weigh_nothing_in_the_policy_terms(tmp_path):
    run = runner(tmp_path, "env.interventions.source=scripted", "env.interventions.share=0.5")
    try:
        batch = run._collect_with_retries(0).batch
    finally:
        run.close()
    samples = batch.training_samples()
    intervened = batch.intervened[batch.valid]
    assert 0 < int(intervened.sum()) < int(batch.valid.sum())  # some episodes of each
    assert samples["policy_weight"].tolist() == (~intervened).float().tolist()
    assert bool(samples["weight"].eq(1).all())


def test_a_run_with_an_operator_logs_its_intervention_rate_when_no_one_intervened(tmp_path):
    """A point each iteration, zero when the operator did nothing, so the chart has one
    for every iteration."""
    run = runner(tmp_path, "env.interventions.source=scripted", "env.interventions.share=0.0")
    try:
        (metrics,) = run.learn()
    finally:
        run.close()
    assert metrics["interventions/rate"] == 0.0 and metrics["interventions/steps"] == 0.0


def test_without_interventions_every_row_counts_in_the_policy_terms(tmp_path):
    run = runner(tmp_path, "algorithm.group_size=2", algorithm="grpo")
    try:
        batch = run._collect_with_retries(0).batch
    finally:
        run.close()
    samples = batch.training_samples()
    assert torch.equal(samples["policy_weight"], samples["weight"])


@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_with_action_chunks_the_human_acts_per_step_and_their_chunks_weigh_nothing(
    tmp_path, algorithm
):
    """Chunks of 5 actions and plans of 5 or 10: the operator steers every env step of
    the episodes it takes over (all of them here, so every episode succeeds), and the
    chunks it drove stay out of the policy's terms."""
    chunked = ["actor.model.num_action_chunks=5", "rollout.action_horizons_pattern=[5,10]",
               "algorithm.group_size=2"]  # fmt: skip
    run = runner(tmp_path, *chunked, "env.interventions.source=scripted",
                 "env.interventions.share=1.0", algorithm=algorithm)  # fmt: skip
    try:
        policy = parameters(run.algorithm.policy)
        batch = run._collect_with_retries(0).batch
        (metrics,) = run.learn()
    finally:
        run.close()
    assert bool(batch.episode_success.all()) and metrics["rollout/success_rate"] == 1.0
    samples = batch.training_samples()
    assert not bool(samples["policy_weight"].any())
    assert metrics["interventions/rate"] == 1.0
    after = parameters(run.algorithm.policy)
    assert all(torch.equal(a, b) for a, b in zip(policy, after, strict=True))


def test_with_action_chunks_only_the_chunks_a_human_drove_leave_the_policy_terms(tmp_path):
    run = runner(tmp_path, "actor.model.num_action_chunks=5",
                 "rollout.action_horizons_pattern=[5]", "env.interventions.source=scripted",
                 "env.interventions.share=0.5")  # fmt: skip
    try:
        batch = run._collect_with_retries(0).batch
    finally:
        run.close()
    samples = batch.training_samples()
    intervened = batch.intervened[batch.valid]
    assert 0 < int(intervened.sum()) < int(batch.valid.sum())
    assert samples["policy_weight"].tolist() == (~intervened).float().tolist()


def test_an_on_policy_run_takes_interventions_on_several_actor_ranks_too():
    """Each rank wraps the copies it steps (tests/trainer/runtime/test_placed_interventions.py)."""
    config = load_config(
        "examples/builtin_ppo.yaml",
        ["env.interventions.source=console", "cluster.num_nodes=1",
         "cluster.component_placement.actor=0:0-1"],  # two actor ranks on node 0
    )  # fmt: skip
    assert config.env.interventions.source == "console"


def test_each_finished_episode_reports_its_intervention_rate_numbered_across_resumes(tmp_path):
    reported = []
    overrides = ["env.interventions.source=scripted", "env.interventions.share=0.5"]

    def learned(iterations: int, resume: bool) -> dict[str, float]:
        config = load_config(
            "examples/builtin_ppo.yaml",
            [*ONE_STEP, f"runner.output_dir={tmp_path}", f"runner.iterations={iterations}",
             *overrides],
        )  # fmt: skip
        run = OnPolicyRunner(
            config, output_dir=tmp_path, on_episodes=lambda *call: reported.append(call)
        )
        try:
            return run.learn(resume=resume)[-1]
        finally:
            run.close()

    metrics = learned(1, resume=False)
    ((first, rates),) = reported
    assert first == 1 and len(rates) == 8  # the iteration's episodes, one rate each
    assert all(0.0 <= rate <= 1.0 for rate in rates)
    assert sum(rate > 0 for rate in rates) == metrics["interventions/episodes"]
    learned(2, resume=True)
    assert [call[0] for call in reported] == [1, 9]  # the resumed run goes on from 9
