"""Benchmark: one PPO update (returns + minibatch epochs), ours vs rsl_rl-lib's PPO.

Both get the same problem: MLP actor and critic with the same hidden sizes and
activation (tanh), the same
number of rows (envs x steps), epochs and minibatches, Adam, clipped surrogate, clipped
value loss, entropy bonus, gradient-norm clipping, advantages normalised over the batch.
rsl_rl runs with ``schedule="fixed"`` (its adaptive schedule computes an extra KL per
minibatch to tune the learning rate, which ours does not do) and ours without KL early
stop, so every minibatch of both takes one optimizer step. Timed: ``compute_returns``
plus ``update``; filling the storages is not timed. Reported: training rows x epochs
per second (median of repeats, alternating the two); ratio = ours / rsl_rl, so above 1
means ours is faster.

Ours trains on chunk steps (here a chunk of 1 from plans of horizon 1), so its update
also recomputes the log-probability of the executed slice of each stored plan.

rsl_rl-lib is a benchmark-only dependency: ``.venv/bin/pip install -e '.[bench]'``.

    .venv/bin/python bench/ppo_update.py [--envs 256] [--steps 32] [--repeats 7]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.algorithms import PPO, OnPolicySettings  # noqa: E402
from trainer.data.rollout_storage import RolloutStorage, Trajectories, Transition  # noqa: E402
from trainer.models.critic import ValueCritic  # noqa: E402
from trainer.models.encoders import MLPEncoder  # noqa: E402
from trainer.models.policy import GaussianChunkPolicy  # noqa: E402

OBS_DIM = 64
ACTION_DIM = 7
HIDDEN = (256, 256)
ACTIVATION = "tanh"  # set on both sides: the defaults differ (ours SiLU, rsl_rl ELU)
SHARED = {
    "epochs": 5,
    "minibatches": 4,
    "clip": 0.2,
    "gamma": 0.99,
    "lam": 0.95,
    "value_loss_coef": 1.0,
    "entropy_coef": 0.01,
    "learning_rate": 1e-3,
    "max_grad_norm": 1.0,
}


def synthetic_rollout(envs: int, steps: int) -> dict[str, torch.Tensor]:
    """Observations, rewards and dones both learners store; every episode spans the
    rollout, so both train on exactly ``envs x steps`` rows."""
    generator = torch.Generator().manual_seed(0)
    dones = torch.zeros(steps, envs, dtype=torch.bool)
    dones[-1] = True
    return {
        "obs": torch.randn(steps + 1, envs, OBS_DIM, generator=generator),
        "reward": torch.rand(steps, envs, generator=generator),
        "done": dones,
    }


# ----- ours ----------------------------------------------------------------------------
def ours_algorithm() -> PPO:
    policy = GaussianChunkPolicy(
        MLPEncoder(OBS_DIM, HIDDEN, ACTIVATION), ACTION_DIM, ACTION_DIM, max_horizon=1
    )
    critic = ValueCritic(MLPEncoder(OBS_DIM, HIDDEN, ACTIVATION), max_horizon=1)
    settings = OnPolicySettings(
        gamma=SHARED["gamma"],
        gae_lambda=SHARED["lam"],
        clip_ratio=SHARED["clip"],
        value_clip=SHARED["clip"],  # rsl_rl clips the value update with clip_param
        value_loss_coef=SHARED["value_loss_coef"],
        entropy_coef=SHARED["entropy_coef"],
        target_kl=None,
        update_epochs=SHARED["epochs"],
        num_minibatches=SHARED["minibatches"],
        learning_rate=SHARED["learning_rate"],
        max_grad_norm=SHARED["max_grad_norm"],
        normalize_advantages=True,
    )
    return PPO(policy, critic, settings, chunk=1, generator=torch.Generator().manual_seed(0))


def ours_batch(algorithm: PPO, data: dict[str, torch.Tensor]) -> Trajectories:
    steps, envs = data["reward"].shape
    storage = RolloutStorage(steps, envs, chunk=1)
    ones = torch.ones(envs, dtype=torch.long)
    with torch.no_grad():
        for t in range(steps):
            obs = data["obs"][t]
            plan, step_log_probs = algorithm.policy.sample_plan(obs, ones)
            zeros = torch.zeros(envs)
            storage.add(
                Transition.of(
                    obs,
                    plan,
                    torch.zeros(envs, dtype=torch.long),
                    step_log_probs[:, 0],
                    reward=data["reward"][t],
                    env_reward=data["reward"][t],
                    done=data["done"][t],
                    timeout=zeros,
                    success=zeros,
                    executed_actions=ones,
                    intervened=zeros,
                    held=zeros,
                )  # fmt: skip
            )
    return algorithm.attach_values(storage.finish(0, torch.arange(envs), torch.arange(envs), ones))


def ours_update(algorithm: PPO, batch: Trajectories) -> float:
    started = time.perf_counter()
    algorithm.update(algorithm.compute_returns(batch))
    return time.perf_counter() - started


# ----- rsl_rl ----------------------------------------------------------------------------
def rsl_algorithm(data: dict[str, torch.Tensor]) -> Any:
    from rsl_rl.algorithms import PPO as RslPPO
    from rsl_rl.models import MLPModel
    from rsl_rl.storage import RolloutStorage as RslStorage
    from tensordict import TensorDict

    steps, envs = data["reward"].shape
    obs = TensorDict({"policy": data["obs"][0]}, batch_size=[envs])
    groups = {"actor": ["policy"], "critic": ["policy"]}
    actor = MLPModel(
        obs,
        groups,
        "actor",
        ACTION_DIM,
        hidden_dims=list(HIDDEN),
        activation=ACTIVATION,
        distribution_cfg={"class_name": "GaussianDistribution", "init_std": 1.0},
    )
    critic = MLPModel(obs, groups, "critic", 1, hidden_dims=list(HIDDEN), activation=ACTIVATION)
    storage = RslStorage("rl", envs, steps, obs, [ACTION_DIM])
    return RslPPO(
        actor,
        critic,
        storage,
        num_learning_epochs=SHARED["epochs"],
        num_mini_batches=SHARED["minibatches"],
        clip_param=SHARED["clip"],
        gamma=SHARED["gamma"],
        lam=SHARED["lam"],
        value_loss_coef=SHARED["value_loss_coef"],
        entropy_coef=SHARED["entropy_coef"],
        learning_rate=SHARED["learning_rate"],
        max_grad_norm=SHARED["max_grad_norm"],
        use_clipped_value_loss=True,
        schedule="fixed",
    )


def rsl_fill(algorithm: Any, data: dict[str, torch.Tensor]) -> Any:
    from tensordict import TensorDict

    steps, envs = data["reward"].shape
    with torch.inference_mode():
        for t in range(steps):
            algorithm.act(TensorDict({"policy": data["obs"][t]}, batch_size=[envs]))
            algorithm.process_env_step(
                TensorDict({"policy": data["obs"][t + 1]}, batch_size=[envs]),
                data["reward"][t],
                data["done"][t],
                {},
            )
    return TensorDict({"policy": data["obs"][steps]}, batch_size=[envs])


def rsl_update(algorithm: Any, last_obs: Any) -> float:
    started = time.perf_counter()
    algorithm.compute_returns(last_obs)
    algorithm.update()
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=256)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    try:
        import rsl_rl  # noqa: F401
    except ImportError:
        print(
            "rsl_rl-lib (the baseline) is not installed; install the benchmark extra with\n"
            "  .venv/bin/pip install -e '.[bench]'",
            file=sys.stderr,
        )
        return 1
    # One thread each: the same budget for both, and steadier figures on a shared machine.
    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = synthetic_rollout(args.envs, args.steps)
    rows = args.envs * args.steps * SHARED["epochs"]
    ours = ours_algorithm()
    batch = ours_batch(ours, data)
    if int(batch.valid.sum()) != args.envs * args.steps:
        raise AssertionError("ours must train on every row")
    rsl = rsl_algorithm(data)
    ours_update(ours, batch)  # warm-up: allocator, Adam state
    rsl_update(rsl, rsl_fill(rsl, data))
    ours_rates, rsl_rates = [], []
    for _ in range(args.repeats):
        ours_rates.append(rows / ours_update(ours, batch))
        rsl_rates.append(rows / rsl_update(rsl, rsl_fill(rsl, data)))
    ours_rate, rsl_rate = statistics.median(ours_rates), statistics.median(rsl_rates)
    version = importlib.metadata.version("rsl-rl-lib")
    print(
        f"{args.envs} envs x {args.steps} steps, {SHARED['epochs']} epochs x "
        f"{SHARED['minibatches']} minibatches, MLP {list(HIDDEN)}, obs {OBS_DIM}, "
        f"actions {ACTION_DIM}, torch {torch.__version__}, rsl_rl-lib {version}"
    )
    print(f"ours: median {ours_rate:,.0f} samples/s; rsl_rl: median {rsl_rate:,.0f} samples/s")
    print(
        f"RESULT bench=ppo_update ours={ours_rate:.0f} baseline={rsl_rate:.0f} "
        f"ratio={ours_rate / rsl_rate:.3f} unit=samples/s better=higher"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
