"""Benchmark: RLPD's learner and its mixed sampling, against Stable-Baselines3 and torchrl.

``rlpd_updates``: learner updates/s (one update = one critic gradient step on a batch of
256; every update here also steps the actor and the temperature, as SB3's SAC does)
of ``trainer.algorithms.rlpd.RLPDLearner`` drawing its batches from
``trainer.data.replay.MixedSampler``, against SB3's ``SAC.train()`` drawing from its
own replay buffer. Same problem for both: obs 64, actions 7, MLP [256, 256] ReLU actor
and critics, two critics whose minimum makes the target, no LayerNorm, Adam at 3e-4,
a learned temperature, Polyak targets updated after every step, batch 256. Ours runs
with ``cta_ratio=1`` so each of its updates does the work of one of SB3's; its RLPD
defaults (ten LayerNorm critics, cta_ratio 2) are timed too and printed for
information.

``rlpd_mixed_sampling``: transitions/s of batches of 256 drawn half from an online
buffer of 100,000 transitions and half from a demo buffer of 10,000 (obs 64, actions
7, the six fields of ``TRANSITION_FIELDS``), ours against two torchrl
``ReplayBuffer``s on ``LazyTensorStorage`` sampled 128 each and concatenated.

Both measured in the same run, medians of alternating repeats, one torch thread each.
The baselines are benchmark-only dependencies: ``.venv/bin/pip install -e '.[bench]'``.

    .venv/bin/python bench/rlpd.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.algorithms.rlpd import RLPDLearner, RLPDSettings  # noqa: E402
from trainer.data.replay import MixedSampler, ReplayBuffer  # noqa: E402

OBS_DIM = 64
ACTION_DIM = 7
HIDDEN = (256, 256)
BATCH = 256
ONLINE_ROWS = 100_000
DEMO_ROWS = 10_000
LEARNING_RATE = 3e-4
UPDATES = 150  # per timed repeat of the learners
SAMPLES = 2_000  # batches per timed repeat of the samplers


def transitions(rows: int, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "obs": torch.randn(rows, OBS_DIM, generator=generator),
        "action": torch.rand(rows, ACTION_DIM, generator=generator) * 2 - 1,
        "reward": (torch.rand(rows, generator=generator) < 0.1).float(),
        "next_obs": torch.randn(rows, OBS_DIM, generator=generator),
        "terminal": torch.rand(rows, generator=generator) < 0.05,
        "intervened": torch.zeros(rows, dtype=torch.bool),
    }


def our_sampler(online_rows: int, demo_rows: int) -> MixedSampler:
    online, demo = ReplayBuffer(online_rows), ReplayBuffer(demo_rows)
    online.add(transitions(online_rows, seed=1))
    demo.add(transitions(demo_rows, seed=2))
    return MixedSampler(online, demo, BATCH, demo_fraction=0.5)


# ----- learners ------------------------------------------------------------------------
def our_learner(settings: RLPDSettings) -> Callable[[int], None]:
    learner = RLPDLearner(OBS_DIM, ACTION_DIM, settings)
    sampler = our_sampler(ONLINE_ROWS, DEMO_ROWS)

    def run(updates: int) -> None:
        for _ in range(updates // settings.cta_ratio):
            learner.update(sampler.sample)

    return run


SB3_LIKE = RLPDSettings(
    critic_ensemble=2,
    critic_subsample=2,
    layer_norm=False,
    hidden_sizes=HIDDEN,
    actor_lr=LEARNING_RATE,
    critic_lr=LEARNING_RATE,
    temperature_lr=LEARNING_RATE,
    cta_ratio=1,
    backup_entropy=True,  # SB3's target subtracts the entropy term
)
RLPD_DEFAULTS = RLPDSettings(hidden_sizes=HIDDEN)


def sb3_learner() -> Callable[[int], None]:
    import gymnasium as gym
    from stable_baselines3 import SAC
    from stable_baselines3.common.logger import configure

    class Spaces(gym.Env):
        """Only the spaces: the replay buffer is filled directly, nothing is stepped."""

        observation_space = gym.spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32)
        action_space = gym.spaces.Box(-1.0, 1.0, (ACTION_DIM,), np.float32)

    model = SAC(
        "MlpPolicy",
        Spaces(),
        learning_rate=LEARNING_RATE,
        buffer_size=ONLINE_ROWS,
        batch_size=BATCH,
        policy_kwargs={"net_arch": list(HIDDEN), "n_critics": 2},
        device="cpu",
        seed=0,
    )
    model.set_logger(configure(None, []))
    data = {name: t.numpy() for name, t in transitions(ONLINE_ROWS, seed=1).items()}
    buffer = model.replay_buffer
    buffer.observations[:, 0] = data["obs"]
    buffer.next_observations[:, 0] = data["next_obs"]
    buffer.actions[:, 0] = data["action"]
    buffer.rewards[:, 0] = data["reward"]
    buffer.dones[:, 0] = data["terminal"]
    buffer.full = True

    def run(updates: int) -> None:
        model.train(gradient_steps=updates, batch_size=BATCH)

    return run


def matmul_floor() -> Callable[[int], None]:
    """The matrix products one SAC update of these networks needs, and nothing else:
    no optimiser, activations, sampling or Python around them. An update cannot be
    faster than these on this machine, whoever writes it."""
    actor = [(OBS_DIM, HIDDEN[0]), (HIDDEN[0], HIDDEN[1]), (HIDDEN[1], 2 * ACTION_DIM)]
    critic = [(OBS_DIM + ACTION_DIM, HIDDEN[0]), (HIDDEN[0], HIDDEN[1]), (HIDDEN[1], 1)] * 2

    def forward(layers: list) -> list:  # x[B, in] @ W[in, out]
        return [(BATCH, n_in, n_out) for n_in, n_out in layers]

    def input_grads(layers: list) -> list:  # dy[B, out] @ W.T[out, in]
        return [(BATCH, n_out, n_in) for n_in, n_out in layers]

    def weight_grads(layers: list) -> list:  # x.T[in, B] @ dy[B, out]
        return [(n_in, BATCH, n_out) for n_in, n_out in layers]

    hidden_critic = [layer for i, layer in enumerate(critic) if i % 3]  # input grads skip x
    shapes = (
        forward(actor) + forward(critic)  # the target: a' ~ π(s'), target Q(s', a')
        + forward(critic) + weight_grads(critic) + input_grads(hidden_critic)  # critic loss
        + forward(actor) + forward(critic) + input_grads(critic)  # actor loss through Q
        + weight_grads(actor) + input_grads(actor[1:])
    )  # fmt: skip
    operands = [(torch.randn(m, k), torch.randn(k, n), torch.empty(m, n)) for m, k, n in shapes]

    def run(updates: int) -> None:
        for _ in range(updates):
            for left, right, out in operands:
                torch.mm(left, right, out=out)

    return run


# ----- samplers -------------------------------------------------------------------------
def our_sampling() -> Callable[[int], None]:
    sampler = our_sampler(ONLINE_ROWS, DEMO_ROWS)

    def run(batches: int) -> None:
        for _ in range(batches):
            sampler.sample()

    return run


def torchrl_sampling() -> Callable[[int], None]:
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage
    from torchrl.data import ReplayBuffer as TorchRLBuffer

    def buffer(rows: int, seed: int) -> Any:
        replay = TorchRLBuffer(storage=LazyTensorStorage(rows), batch_size=BATCH // 2)
        replay.extend(TensorDict(transitions(rows, seed), batch_size=[rows]))
        return replay

    online, demo = buffer(ONLINE_ROWS, 1), buffer(DEMO_ROWS, 2)

    def run(batches: int) -> None:
        for _ in range(batches):
            torch.cat([online.sample(), demo.sample()])

    return run


def rate(run: Callable[[int], None], count: int) -> float:
    started = time.perf_counter()
    run(count)
    return count / (time.perf_counter() - started)


def medians(pair: dict[str, Callable[[int], None]], count: int, repeats: int) -> dict[str, float]:
    for run in pair.values():
        run(max(count // 10, 2))  # warm-up: allocator, optimiser state
    rates: dict[str, list[float]] = {name: [] for name in pair}
    for _ in range(repeats):
        for name, run in pair.items():
            rates[name].append(rate(run, count))
    return {name: statistics.median(values) for name, values in rates.items()}


def result(name: str, ours: float, baseline: float, unit: str) -> None:
    print(
        f"RESULT bench={name} ours={ours:.1f} baseline={baseline:.1f} "
        f"ratio={ours / baseline:.3f} unit={unit} better=higher"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    try:
        import stable_baselines3  # noqa: F401
        import torchrl  # noqa: F401
    except ImportError:
        print(
            "stable-baselines3 and torchrl (the baselines) are not installed; install the\n"
            "benchmark extra with  .venv/bin/pip install -e '.[bench]'",
            file=sys.stderr,
        )
        return 1
    torch.set_num_threads(1)  # the same budget for both, steadier on a shared machine
    torch.manual_seed(0)
    versions = ", ".join(
        f"{package} {importlib.metadata.version(package)}"
        for package in ("torch", "stable-baselines3", "torchrl")
    )
    print(f"obs {OBS_DIM}, actions {ACTION_DIM}, MLP {list(HIDDEN)}, batch {BATCH}; {versions}")

    updates = medians(
        {
            "ours": our_learner(SB3_LIKE),
            "sb3": sb3_learner(),
            "rlpd_defaults": our_learner(RLPD_DEFAULTS),
            "floor": matmul_floor(),
        },
        UPDATES,
        args.repeats,
    )
    print(
        f"updates/s: ours {updates['ours']:.1f}, SB3 SAC {updates['sb3']:.1f}; ours with the "
        f"RLPD defaults (10 LayerNorm critics, cta_ratio 2) {updates['rlpd_defaults']:.1f}"
    )
    print(
        f"floor: the matrix products of one update alone allow {updates['floor']:.1f} "
        f"updates/s on this machine; 3x SB3 would be {3 * updates['sb3']:.1f}"
    )
    sampling = medians(
        {"ours": our_sampling(), "torchrl": torchrl_sampling()}, SAMPLES, args.repeats
    )
    ours_rate, torchrl_rate = sampling["ours"] * BATCH, sampling["torchrl"] * BATCH
    print(f"mixed sampling, transitions/s: ours {ours_rate:,.0f}, torchrl {torchrl_rate:,.0f}")
    result("rlpd_updates", updates["ours"], updates["sb3"], "updates/s")
    result("rlpd_updates_floor", updates["ours"], updates["floor"], "updates/s")
    result("rlpd_mixed_sampling", ours_rate, torchrl_rate, "transitions/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
