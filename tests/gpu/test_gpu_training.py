"""Training on a CUDA GPU: PPO, GRPO and RLPD iterations on the built-in env, bf16,
checkpoints that cross between GPU and CPU, and a two-process NCCL group.

Skipped without CUDA. Imports only the trainer (torch, numpy, pydantic, ruamel.yaml):
on a bare CUDA machine, from a copy of the repo,

    python -m pytest tests/gpu --noconftest -p no:cacheprovider -q
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from trainer.algorithms import PPO, OnPolicySettings
from trainer.algorithms.rlpd import RLPDLearner, RLPDSettings
from trainer.config import load_config
from trainer.data.replay import MixedSampler, ReplayBuffer, add_transitions, compact_images
from trainer.models import GaussianChunkPolicy, ValueCritic, build_encoder
from trainer.runner.on_policy_runner import OnPolicyRunner
from trainer.runner.rlpd_runner import RLPDRunner

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
REPO = Path(__file__).resolve().parents[2]
CUDA = torch.device("cuda", 0)


def _config(tmp_path: Path, example: str, *overrides: str):
    return load_config(
        REPO / "examples" / example,
        ["runner.progress=false", f"runner.output_dir={tmp_path}", *overrides],
    )


def _with_repo_on_path() -> dict[str, str]:
    """The environment for a child process: the repo first, then what the parent's
    path had (the wheels a bare machine was given)."""
    path = [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


def _devices(module: torch.nn.Module) -> set[str]:
    return {p.device.type for p in module.parameters()}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_ppo_learns_on_the_gpu(tmp_path, precision):
    config = _config(
        tmp_path, "builtin_ppo.yaml", "actor.device=cuda", f"actor.precision={precision}",
        "runner.iterations=12", "env.task_ids=[0]",
        "algorithm.target_kl=null",  # no early stop: the minibatch steps replay graphs
    )  # fmt: skip
    runner = OnPolicyRunner(config, output_dir=tmp_path)
    try:
        assert _devices(runner.algorithm.policy) == {"cuda"}
        assert _devices(runner.algorithm.critic) == {"cuda"}
        history = runner.learn()
    finally:
        runner.close()
    graphs = runner.algorithm.step_graphs
    assert not graphs.failed and graphs.steps  # the rounds' row counts, padded
    assert all(step.graph is not None for step in graphs.steps.values())
    decisions = runner.algorithm.decision_graphs
    assert not decisions.failed and decisions.graphs == runner.algorithm.plan_cache.period
    assert [round(h["losses/updates"]) > 0 for h in history] == [True] * 12
    assert 0 < history[-1]["device/memory_allocated_gb"] <= history[-1]["device/memory_peak_gb"]
    first = history[0]["rollout/success_rate"]
    last = sum(h["rollout/success_rate"] for h in history[-3:]) / 3
    assert last > first, (first, last)
    state = runner.algorithm.optimizer.state_dict()["state"]
    assert all(s["exp_avg"].device.type == "cuda" for s in state.values())


def test_the_first_minibatch_recomputes_the_rollout_log_probs_on_the_gpu(tmp_path):
    config = _config(tmp_path, "builtin_ppo.yaml", "actor.device=cuda", "env.num_parallel_envs=8",
                     "algorithm.data_batch_size=8", "algorithm.num_minibatches=1")  # fmt: skip
    runner = OnPolicyRunner(config, output_dir=tmp_path)
    try:
        collected = runner._collect_with_retries(0)
        rows = runner.algorithm.compute_returns(collected.batch).training_samples()
        assert rows["obs"].device.type == "cuda"
        stats = runner.algorithm._minibatch_step(rows)
    finally:
        runner.close()
    assert float(stats["losses/approx_kl"]) == pytest.approx(0.0, abs=1e-5)


def test_grpo_with_the_group_filter_on_the_gpu(tmp_path):
    config = _config(tmp_path, "builtin_grpo.yaml", "actor.device=cuda", "runner.iterations=3")
    runner = OnPolicyRunner(config, output_dir=tmp_path)
    try:
        history = runner.learn()
    finally:
        runner.close()
    assert len(history) == 3 and all("losses/policy_loss" in h for h in history)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_rlpd_learns_on_the_gpu_with_its_buffers_there(tmp_path, precision):
    config = _config(
        tmp_path, "builtin_rlpd.yaml", "actor.device=cuda", "runner.iterations=4",
        "algorithm.rlpd.training_starts=100", f"actor.precision={precision}",
    )  # fmt: skip
    runner = RLPDRunner(config, output_dir=tmp_path)
    try:
        history = runner.learn()
    finally:
        runner.close()
    algorithm = runner.algorithm
    assert algorithm.learner.updates > 0
    assert _devices(algorithm.learner.critic) == {"cuda"}
    assert algorithm.online.fields["obs"].device.type == "cuda"
    assert "rlpd/critic_loss" in history[-1]


def test_camera_frames_stay_uint8_in_gpu_buffers_and_train_the_cnn():
    """The built-in env has no camera; LIBERO's frames take this path."""
    shape = (3, 32, 32)
    learner = RLPDLearner(shape, 4, RLPDSettings(hidden_sizes=(32, 32)), CUDA)
    online, demo = ReplayBuffer(256, CUDA), ReplayBuffer(64, CUDA)
    frames = compact_images(torch.rand(64, *shape))
    rows = {
        "obs": frames, "action": torch.rand(64, 4) * 2 - 1, "reward": torch.rand(64),
        "next_obs": frames, "terminal": torch.zeros(64, dtype=torch.bool),
        "intervened": torch.arange(64) % 4 == 0,
    }  # fmt: skip
    add_transitions(online, demo, rows)
    assert online.fields["obs"].dtype == torch.uint8 and online.fields["obs"].is_cuda
    sampler = MixedSampler(online, demo, 32, fields=learner.fields)
    generator = torch.Generator().manual_seed(0)
    metrics = learner.update(lambda: sampler.sample(generator))
    assert metrics["rlpd/critic_loss"].is_cuda and learner.updates == 2


def _rlpd_batches(count: int) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(3)
    made = []
    for _ in range(count):
        made.append({
            "obs": torch.randn(64, 10, generator=generator),
            "action": torch.rand(64, 4, generator=generator) * 2 - 1,
            "reward": (torch.rand(64, generator=generator) < 0.2).float(),
            "next_obs": torch.randn(64, 10, generator=generator),
            "terminal": torch.rand(64, generator=generator) < 0.1,
        })  # fmt: skip
    return [{name: tensor.to(CUDA) for name, tensor in batch.items()} for batch in made]


def _rlpd_rounds(learner: RLPDLearner, batches, rounds: int) -> list[dict[str, float]]:
    """`rounds` update rounds of `learner`, each on the next `cta_ratio` batches."""
    feed = iter(batches)
    metrics = [learner.update(lambda: next(feed)) for _ in range(rounds)]
    return [{key: float(value) for key, value in row.items()} for row in metrics]


def _same_learners(first: RLPDLearner, second: RLPDLearner) -> None:
    for a, b in zip(first.state_dict()["critic"].values(), second.state_dict()["critic"].values(),
                    strict=True):  # fmt: skip
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    for a, b in zip(first.actor.parameters(), second.actor.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_rlpd_rounds_replayed_from_a_cuda_graph_compute_what_eager_rounds_do():
    """Warm-up rounds, the capture, then replays: every round's statistics are its own
    (not the last replay's) and the learner ends where one launching kernel by kernel
    does, with the same random draws (the graph advances the GPU's generator alike)."""
    settings = RLPDSettings(hidden_sizes=(64, 64))
    learners = {}
    for graphed in (False, True):
        torch.manual_seed(0)
        learners[graphed] = RLPDLearner(
            10, 4, dataclasses.replace(settings, cuda_graph=graphed), CUDA
        )
    assert learners[False].graphed_round is None and learners[True].graphed_round is not None
    batches = _rlpd_batches(2 * 8)
    runs = {}
    for graphed, learner in learners.items():
        torch.cuda.manual_seed(1)
        runs[graphed] = _rlpd_rounds(learner, batches, 8)
    assert learners[True].graphed_round.graph is not None  # 3 eager rounds, then replays
    assert learners[True].updates == learners[False].updates == 16
    losses = [row["rlpd/critic_loss"] for row in runs[True]]
    assert len(set(losses)) == len(losses)
    for eager, replayed in zip(runs[False], runs[True], strict=True):
        assert eager.keys() == replayed.keys()
        for key in eager:
            assert replayed[key] == pytest.approx(eager[key], rel=1e-3, abs=1e-5), key
    _same_learners(learners[False], learners[True])


def test_a_graphed_rlpd_learner_loads_a_checkpoint_and_captures_again():
    """Loading replaces the optimisers' state tensors the graph pointed at: the next
    rounds run from the loaded state, not from stale copies."""
    settings = RLPDSettings(hidden_sizes=(64, 64))
    torch.manual_seed(0)
    source = RLPDLearner(10, 4, dataclasses.replace(settings, cuda_graph=False), CUDA)
    torch.manual_seed(5)
    graphed = RLPDLearner(10, 4, settings, CUDA)
    batches = _rlpd_batches(2 * 12)
    _rlpd_rounds(source, batches[:8], 4)
    _rlpd_rounds(graphed, batches[8:], 8)  # captured and replayed
    assert graphed.graphed_round.graph is not None
    graphed.load_state_dict(copy.deepcopy(source.state_dict()))
    assert graphed.graphed_round.graph is None and graphed.updates == source.updates
    torch.cuda.manual_seed(2)
    _rlpd_rounds(source, batches[8:], 8)
    torch.cuda.manual_seed(2)
    _rlpd_rounds(graphed, batches[8:], 8)
    assert graphed.graphed_round.graph is not None and graphed.updates == source.updates == 24
    _same_learners(source, graphed)


def test_pixel_rlpd_rounds_replayed_from_a_cuda_graph_compute_what_eager_rounds_do():
    """Camera frames (uint8, as the buffers keep them) with the actor on the critics'
    encoder and random shifts: the shifts are drawn and applied inside the captured
    round, and replays end where eager rounds do with the same draws."""
    shape = (3, 32, 32)
    settings = RLPDSettings(hidden_sizes=(64, 64), critic_ensemble=4)
    assert settings.shared_encoder and settings.image_augmentation == "random_shift"
    learners = {}
    for graphed in (False, True):
        torch.manual_seed(0)
        learners[graphed] = RLPDLearner(
            shape, 4, dataclasses.replace(settings, cuda_graph=graphed), CUDA
        )
    generator = torch.Generator().manual_seed(3)
    batches = [
        {
            "obs": torch.randint(0, 256, (64, *shape), dtype=torch.uint8, generator=generator),
            "action": torch.rand(64, 4, generator=generator) * 2 - 1,
            "reward": (torch.rand(64, generator=generator) < 0.2).float(),
            "next_obs": torch.randint(0, 256, (64, *shape), dtype=torch.uint8, generator=generator),
            "terminal": torch.rand(64, generator=generator) < 0.1,
        }
        for _ in range(2 * 8)
    ]
    batches = [{name: tensor.to(CUDA) for name, tensor in batch.items()} for batch in batches]
    runs = {}
    for graphed, learner in learners.items():
        torch.cuda.manual_seed(1)
        runs[graphed] = _rlpd_rounds(learner, batches, 8)
    assert learners[True].graphed_round.graph is not None
    for eager, replayed in zip(runs[False], runs[True], strict=True):
        for key in eager:
            assert replayed[key] == pytest.approx(eager[key], rel=1e-3, abs=1e-5), key
    _same_learners(learners[False], learners[True])
    shared = learners[True]
    assert shared.actor.encoder.cnn.conv is shared.critic.encoder.cnn.conv


def _graph_pair_ppo(graphed: bool, precision: str = "fp32", device=CUDA) -> PPO:
    torch.manual_seed(0)
    policy = GaussianChunkPolicy(build_encoder("mlp", (6,), (64, 64)), 3, 3, 4)
    critic = ValueCritic(build_encoder("mlp", (6,), (64, 64)), max_horizon=4)
    settings = OnPolicySettings(
        update_epochs=3, num_minibatches=4, entropy_coef=0.01, cuda_graph=graphed
    )
    return PPO(policy, critic, settings, chunk=2, generator=torch.Generator().manual_seed(0),
               device=device, precision=precision)  # fmt: skip


def _ppo_rows(count: int, seed: int) -> dict[str, torch.Tensor]:
    """Rows with the log-probs of the untrained policy, on the GPU."""
    from tests.trainer.runtime.test_gradient_sync import rows

    made = rows(_graph_pair_ppo(False, device="cpu"), count, seed)
    return {name: tensor.to(CUDA) for name, tensor in made.items()}


def _same_models(first: PPO, second: PPO, tolerance: float) -> None:
    for a, b in zip(first.state_dict()["policy"].values(), second.state_dict()["policy"].values(),
                    strict=True):  # fmt: skip
        torch.testing.assert_close(a, b, rtol=tolerance, atol=tolerance)
    for a, b in zip(first.critic.parameters(), second.critic.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize(
    ("precision", "masked"), [("fp32", False), ("bf16", False), ("fp32", True)]
)
def test_ppo_steps_replayed_from_cuda_graphs_compute_what_eager_steps_do(precision, masked):
    """Warm-up steps, a capture per padded minibatch size (203 rows make minibatches of
    50-51, padded to 52; 150 rows 37-38, padded to 40), then replays: every step's
    statistics are its own and the models end where eager steps leave them. `masked`:
    rows that weigh nothing (the group filter's), the last batch's all of them: its
    steps are skipped on the device, replayed or eager."""
    algorithms = {graphed: _graph_pair_ppo(graphed, precision) for graphed in (False, True)}
    assert algorithms[False].step_graphs is None
    tolerance = 1e-4 if precision == "fp32" else 2e-2
    for seed, count in enumerate([203, 203, 150, 203]):
        samples = _ppo_rows(count, seed)
        if masked:
            # a third of the rows, then all of them
            weightless = torch.arange(count, device=CUDA) % (3 if seed < 3 else 1) == 0
            for name in ("weight", "policy_weight"):
                samples[name] = samples[name].masked_fill(weightless, 0.0)
        eager, replayed = (algorithms[g].update_rows(dict(samples)) for g in (False, True))
        assert eager.keys() == replayed.keys()
        for key in eager:
            assert replayed[key] == pytest.approx(eager[key], rel=tolerance, abs=tolerance), key
    graphs = algorithms[True].step_graphs
    assert not graphs.failed and sorted(size for size, _ in graphs.steps) == [40, 52]
    assert all(step.graph is not None for step in graphs.steps.values())
    assert algorithms[True].optimizer_steps == algorithms[False].optimizer_steps == 48
    _same_models(algorithms[False], algorithms[True], tolerance)


@contextlib.contextmanager
def _syncs(found: list[str]):
    """Every sync with the GPU inside, one line each (torch's sync debug mode warns)."""
    mode = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
    finally:
        torch.cuda.set_sync_debug_mode(mode)
    found += [str(w.message) for w in caught if "synchronizing" in str(w.message)]


def _watch(owner: object, method: str, calls: list[list[str]]) -> None:
    """From now on, each call of `owner.method` adds the syncs it made to `calls`."""
    watched = getattr(owner, method)

    def call(*args, **kwargs):
        calls.append([])
        with _syncs(calls[-1]):
            return watched(*args, **kwargs)

    setattr(owner, method, call)


@pytest.mark.parametrize("example", ["builtin_ppo.yaml", "builtin_grpo.yaml"])
def test_no_step_of_the_rollout_or_the_update_syncs_but_to_bring_the_actions_back(
    tmp_path, example
):
    """Once the graphs are captured (the first iteration), an env step syncs once, for
    its actions, and a minibatch step never: the time-out bootstrap, the masked groups'
    skipped steps and the statistics all stay on the GPU. The CPU suite's read guard
    (tests/trainer/test_devices.py) finds reads in the code; this finds what torch does."""
    config = _config(tmp_path, example, "actor.device=cuda", "algorithm.target_kl=null")
    runner = OnPolicyRunner(config, output_dir=tmp_path)
    algorithm = runner.algorithm
    acting, stepping, updating = [], [], []
    try:
        runner.train_iteration()
        decisions, steps = algorithm.decision_graphs.graphs, set(algorithm.step_graphs.steps)
        _watch(algorithm, "act", acting)
        _watch(algorithm, "process_env_step", stepping)
        _watch(algorithm.step_graphs, "step", updating)
        runner.train_iteration()
    finally:
        runner.close()
    # A phase or a minibatch size first met now is captured, which syncs; nothing else.
    fresh = algorithm.decision_graphs.graphs - decisions
    assert len(acting) > fresh and sum(len(syncs) != 1 for syncs in acting) <= fresh, acting
    assert stepping and not any(stepping), [s for s in stepping if s][:3]
    fresh = len(set(algorithm.step_graphs.steps) - steps)
    assert len(updating) > fresh and sum(bool(syncs) for syncs in updating) <= fresh


def test_no_rlpd_step_syncs_but_to_bring_the_actions_back(tmp_path):
    config = _config(tmp_path, "builtin_rlpd.yaml", "actor.device=cuda",
                     "algorithm.rlpd.training_starts=100")  # fmt: skip
    runner = RLPDRunner(config, output_dir=tmp_path)
    algorithm = runner.algorithm
    acting, taking = [], []
    try:
        for _ in range(2):  # exploring, then acting and capturing the round
            runner.train_iteration()
        assert algorithm.learner.graphed_round.graph is not None
        _watch(algorithm, "act", acting)
        _watch(algorithm, "take_step", taking)  # the buffers and the update rounds
        runner.train_iteration()
    finally:
        runner.close()
    assert acting and all(len(syncs) == 1 for syncs in acting), acting[:3]
    assert taking and not any(taking), [s for s in taking if s][:3]


def test_a_graphed_ppo_loads_a_checkpoint_and_captures_again():
    """Loading replaces the optimizer's state tensors the graphs pointed at: the next
    steps run from the loaded state, not from stale copies."""
    source, graphed = _graph_pair_ppo(False), _graph_pair_ppo(True)
    graphed.update_rows(_ppo_rows(203, 0))  # captured and replayed
    assert graphed.step_graphs.steps
    source.update_rows(_ppo_rows(160, 1))
    graphed.load_state_dict(copy.deepcopy(source.state_dict()))
    assert not graphed.step_graphs.steps and graphed.optimizer_steps == source.optimizer_steps
    assert all(group["capturable"] for group in graphed.optimizer.param_groups)
    for algorithm in (source, graphed):
        algorithm.generator = torch.Generator().manual_seed(7)
        for seed in (2, 3):
            algorithm.update_rows(_ppo_rows(203, seed))
    assert graphed.step_graphs.steps
    _same_models(source, graphed, 1e-4)


@pytest.mark.parametrize("pattern", [[5, 10, 15], [5]])  # [5]: every plan one chunk
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_decisions_replayed_from_cuda_graphs_are_recomputed_exactly(precision, pattern):
    """Each phase of the plan cache's schedule captured once, then replayed: the round's
    stored rows (their plan observations, offsets, chunks) give back the log-probs the
    replays drew, and replays draw fresh noise."""
    from trainer.envs import BuiltinReachEnv
    from trainer.models import assign_horizons
    from trainer.runner.collection import run_round

    env = BuiltinReachEnv(num_envs=64, max_episode_steps=40)
    policy = GaussianChunkPolicy(build_encoder("mlp", env.obs_shape, (64, 64)), 7, 7, 15)
    algorithm = PPO(policy, None, OnPolicySettings(), chunk=5, device=CUDA, precision=precision)
    horizons = assign_horizons(pattern, 64)
    states = [i % env.init_states(0).shape[0] for i in range(64)]
    matmul = torch.backends.cuda.matmul
    tf32, matmul.allow_tf32 = matmul.allow_tf32, False  # fp32 means fp32 here
    try:
        batches = [run_round(env, algorithm, 0, states, horizons, num_steps=8) for _ in range(4)]
        recomputed = []
        for batch in batches[1:]:  # decided by replays
            valid = batch.valid
            with algorithm.autocast():
                log_prob, _ = policy.chunk_log_prob(
                    batch.plan_obs[valid], batch.plan_horizon[valid], batch.chunk_offset[valid],
                    batch.actions[valid],
                )  # fmt: skip
            recomputed.append((log_prob, batch.log_prob[valid]))
    finally:
        matmul.allow_tf32 = tf32
    graphs = algorithm.decision_graphs
    assert not graphs.failed and graphs.graphs == algorithm.plan_cache.period
    tolerance = 1e-4 if precision == "fp32" else 2e-2
    for log_prob, drawn in recomputed:
        torch.testing.assert_close(log_prob, drawn, atol=tolerance, rtol=0)
    assert not torch.equal(batches[2].actions, batches[3].actions)
    with torch.no_grad():  # the first chunks' noise: N(0, 1) draws
        mean = policy.plan_mean(batches[3].plan_obs[0], horizons.to(CUDA))[:, :5]
        noise = (batches[3].actions[0] - mean) / policy.log_std.exp()
    assert abs(float(noise.mean())) < 0.1 and abs(float(noise.std()) - 1) < 0.1


FSDP_ONE_GPU = """
import sys, torch
from pathlib import Path
from tests.trainer.runtime.test_gradient_sync import rows
from trainer.algorithms import PPO, OnPolicySettings
from trainer.algorithms.collective import TorchCollective
from trainer.models import GaussianChunkPolicy, build_encoder
port, folder = int(sys.argv[1]), Path(sys.argv[2])
device = torch.device("cuda", 0)
settings = OnPolicySettings(update_epochs=2)
def policy():
    torch.manual_seed(0)
    return GaussianChunkPolicy(build_encoder("mlp", (6,), (64,)), 3, 3, 4)
samples = rows(PPO(policy(), None, settings, chunk=2), 16, seed=0)
group = TorchCollective(0, 1, "127.0.0.1", port, "nccl", 60.0, device)
algorithm = PPO(policy(), None, settings, chunk=2, device=device)
algorithm.collective = group
# shard()'s steps on a one-rank mesh, which shard() itself leaves whole: the most of
# FSDP2 (DTensors, the sharded optimizer, torch.distributed.checkpoint) one GPU runs.
import trainer.algorithms.sharding as sharding
algorithm.acting_policy = sharding.acting_copy(algorithm.policy)
sharding.shard(algorithm.policy, sharding.device_mesh(device, 1))
algorithm.optimizer = algorithm._make_optimizer()
algorithm.sharded = True
algorithm.update_rows({key: value.to(device) for key, value in samples.items()})
state = algorithm.state_dict(folder / "iter_000001.shards")
trained = [p.detach().cpu() for p in algorithm.acting_policy.parameters()]
group.close()
single = PPO(policy(), None, settings, chunk=2)  # on the CPU, unsharded, no group
single.load_state_dict({"shards": str(folder / state["shards"])})
loaded = [p.detach() for p in single.policy.parameters()]
untrained = [p.detach() for p in policy().parameters()]
moved = max(float((a - b).abs().max()) for a, b in zip(trained, untrained))
gap = max(float((a - b).abs().max()) for a, b in zip(trained, loaded))
print(sorted(p.name for p in (folder / state["shards"]).glob("*.distcp")), moved > 0, gap < 1e-5)
"""


def test_fsdp_on_one_gpu_updates_and_its_shards_load_unsharded_on_the_cpu(tmp_path):
    """FSDP2's code paths on CUDA with the one GPU there is (a one-rank NCCL group)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    done = subprocess.run(
        [sys.executable, "-c", FSDP_ONE_GPU, str(port), str(tmp_path)],
        env=_with_repo_on_path(), capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.stdout.strip() == "['__0_0.distcp'] True True", done.stderr[-3000:]


@pytest.mark.parametrize(("first", "then"), [("cuda", "cpu"), ("cpu", "cuda")])
def test_a_checkpoint_resumes_across_devices(tmp_path, first, then):
    common = [
        "env.num_parallel_envs=8",
        "algorithm.data_batch_size=16",
        "runner.checkpoint_every=2",
    ]
    config = _config(tmp_path, "builtin_ppo.yaml", f"actor.device={first}", "runner.iterations=2",
                     *common)  # fmt: skip
    runner = OnPolicyRunner(config, output_dir=tmp_path)
    try:
        runner.learn()
        saved = {k: v.cpu() for k, v in runner.algorithm.policy.state_dict().items()}
    finally:
        runner.close()
    config = _config(tmp_path, "builtin_ppo.yaml", f"actor.device={then}", "runner.iterations=3",
                     *common)  # fmt: skip
    resumed = OnPolicyRunner(config, output_dir=tmp_path)
    try:
        resumed.restore()
        loaded = resumed.algorithm.policy.state_dict()
        assert all(torch.equal(saved[k], v.cpu()) for k, v in loaded.items())
        assert {v.device.type for v in loaded.values()} == {then}
        history = resumed.learn()  # the optimizer's state moved with the weights
    finally:
        resumed.close()
    assert resumed.iteration == 3 and len(history) == 1


def test_an_rlpd_checkpoint_from_the_gpu_resumes_on_the_cpu(tmp_path):
    base = ["runner.iterations=2", "runner.checkpoint_every=2", "algorithm.rlpd.training_starts=50"]
    runner = RLPDRunner(_config(tmp_path, "builtin_rlpd.yaml", "actor.device=cuda", *base))
    try:
        runner.learn()
    finally:
        runner.close()
    config = _config(tmp_path, "builtin_rlpd.yaml", "actor.device=cpu", "runner.iterations=3",
                     "runner.checkpoint_every=2", "algorithm.rlpd.training_starts=50")  # fmt: skip
    resumed = RLPDRunner(config)
    try:
        resumed.learn(resume=True)
    finally:
        resumed.close()
    assert resumed.iteration == 3
    assert resumed.algorithm.online.fields["obs"].device.type == "cpu"


def two_ranks(script: str, timeout_s: float) -> list[str]:
    """What `script` prints as rank 0 and rank 1 of a group rendezvousing on a free port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = _with_repo_on_path()
    ranks = [
        subprocess.Popen([sys.executable, "-c", script, str(rank), str(port)], env=env,
                         stdout=subprocess.PIPE, text=True)
        for rank in range(2)
    ]  # fmt: skip
    return [rank.communicate(timeout=timeout_s)[0].strip() for rank in ranks]


NCCL_RANK = """
import sys, torch
from trainer.algorithms.collective import TorchCollective
rank, port = int(sys.argv[1]), int(sys.argv[2])
device = torch.device("cuda", rank)
group = TorchCollective(rank, 2, "127.0.0.1", port, "nccl", 60.0, device)
summed = group.sum_tensor(torch.full((3,), float(rank + 1), device=device))
counts = group.sum_counts(__import__("collections").Counter(episodes=rank + 1))
print(summed.tolist(), counts["episodes"], group.any(rank == 1))
group.close()
"""


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="a NCCL group needs two GPUs")
def test_two_ranks_sum_on_their_gpus_with_nccl_and_count_on_the_cpu():
    outputs = two_ranks(NCCL_RANK, timeout_s=120)
    assert outputs == ["[3.0, 3.0, 3.0] 3.0 True"] * 2


FSDP_RANK = """
import sys, torch
from tests.trainer.runtime.test_gradient_sync import rows
from trainer.algorithms import PPO, OnPolicySettings
from trainer.algorithms.collective import TorchCollective
from trainer.models import GaussianChunkPolicy, build_encoder
rank, port = int(sys.argv[1]), int(sys.argv[2])
device = torch.device("cuda", rank)
group = TorchCollective(rank, 2, "127.0.0.1", port, "nccl", 60.0, device)
torch.manual_seed(0)
policy = GaussianChunkPolicy(build_encoder("mlp", (6,), (64,)), 3, 3, 4)
settings = OnPolicySettings(update_epochs=2)
samples = rows(PPO(policy, None, settings, chunk=2), 12 + 8 * rank, seed=rank)  # on the CPU
algorithm = PPO(policy, None, settings, chunk=2, device=device)
algorithm.collective = group
samples = {key: value.to(device) for key, value in samples.items()}
algorithm.shard()
algorithm.update_rows(samples)
state = algorithm.state_dict()
shards = [p.to_local().shape[0] for p in algorithm.policy.parameters()]
print(round(sum(float(t.double().sum()) for t in state["policy"].values()), 9), shards[1])
group.close()
"""


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="FSDP over NCCL needs two GPUs")
def test_fsdp_shards_a_ppo_update_over_two_gpus():
    outputs = two_ranks(FSDP_RANK, timeout_s=180)
    assert outputs[0] == outputs[1] and outputs[0].endswith(" 32"), outputs  # 64 rows, halved
