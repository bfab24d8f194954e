"""Benchmark: the trainer on a CUDA GPU, each part against its floor on the same GPU.

- ``gpu_ppo_update``: our PPO update (returns, then 5 epochs x 4 minibatches) at Isaac
  Lab scale (4096 envs x 24 steps, MLP [512, 256, 128] actor and critic, ELU) against a
  minimal-torch PPO update of the same sizes written straight in this file (the same
  GAE, normalised advantages, clipped surrogate, value loss, entropy, Adam and gradient
  clip, and nothing else). ratio = floor time / our time: 1 is the floor, rsl_rl-lib
  5.5.1 measured 0.67-0.71 of it on an H200. Target >= 0.9. Our minibatch steps replay
  CUDA graphs (``algorithm.cuda_graph``); ``gpu_ppo_update_eager`` launches them kernel
  by kernel. ``gpu_ppo_update_bf16``: ours with ``precision=bf16`` against the same fp32
  floor.
- ``gpu_rollout``: rounds of the built-in env (CPU) with our policy on the GPU, through
  the rollout loop (plan cache, storage, transfers), against the raw env stepped with
  the same model calls on the GPU and the same transfers. Target >= 0.9. Our decisions
  replay CUDA graphs (``rollout.cuda_graph``); ``gpu_rollout_eager`` launches them
  kernel by kernel, as the floor's model calls are.
- ``gpu_rlpd_updates``: our RLPD learner's update rounds with its default sizes, batches
  drawn from buffers on the GPU, against the matrix products of the same rounds alone
  (batched over the critic ensemble) on the same GPU. Target >= 0.7.
  ``gpu_rlpd_updates_eager``: the same rounds launched kernel by kernel
  (``algorithm.rlpd.cuda_graph: false``).

Each part also prints the ops its eager run and the floor dispatch (views left out):
on a GPU each is a kernel launch, what a graph replays without Python; and how often
one call made the host wait for the GPU (syncs: a rollout step's actions coming back
is one).

It imports only torch, numpy and the trainer's small dependencies (pydantic,
ruamel.yaml): it runs from a copy of the repo on a CUDA machine without the control
plane. Without CUDA it says so and exits 0.

    python bench/gpu.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.algorithms import PPO, OnPolicySettings  # noqa: E402
from trainer.algorithms.rlpd import RLPDLearner, RLPDSettings  # noqa: E402
from trainer.data.replay import MixedSampler, ReplayBuffer  # noqa: E402
from trainer.data.rollout_storage import Trajectories  # noqa: E402
from trainer.devices import enable_fast_matmul  # noqa: E402
from trainer.envs import BuiltinReachEnv  # noqa: E402
from trainer.models.critic import ValueCritic  # noqa: E402
from trainer.models.encoders import MLPEncoder  # noqa: E402
from trainer.models.plan_cache import assign_horizons  # noqa: E402
from trainer.models.policy import GaussianChunkPolicy  # noqa: E402
from trainer.runner.collection import run_round  # noqa: E402

ENVS, STEPS, OBS_DIM, ACTION_DIM = 4096, 24, 48, 12
HIDDEN = (512, 256, 128)
EPOCHS, MINIBATCHES = 5, 4
CLIP, GAMMA, LAM, LR, MAX_GRAD_NORM = 0.2, 0.99, 0.95, 1e-3, 1.0
VALUE_COEF, ENTROPY_COEF = 1.0, 0.01


def timed(run: Callable[[], object], device: torch.device) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda _: None
    sync(device)
    started = time.perf_counter()
    run()
    sync(device)
    return time.perf_counter() - started


def median_pair(ours: Callable[[], object], floor: Callable[[], object], device, repeats: int):
    """Median seconds of each, alternating, after one warm-up of each."""
    timed(ours, device), timed(floor, device)
    times: dict[str, list[float]] = {"ours": [], "floor": []}
    for _ in range(repeats):
        times["ours"].append(timed(ours, device))
        times["floor"].append(timed(floor, device))
    return statistics.median(times["ours"]), statistics.median(times["floor"])


def ops(run: Callable[[], object]) -> int:
    """The ops one call of `run` dispatches that compute (views left out): on a GPU,
    what an eager run launches and a graph holds, one kernel or so each."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        computed = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not func.is_view and func.namespace == "aten":
                self.computed += 1
            return func(*args, **(kwargs or {}))

    with Count() as count:
        run()
    return count.computed


def syncs(run: Callable[[], object], device: torch.device) -> str:
    """How often one call of `run` made the host wait for the GPU (a sync: a read of a
    value, a plain copy between host and GPU), as torch's sync debug mode counts them."""
    if device.type != "cuda":
        return "n/a (no GPU)"
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return str(sum("synchronizing" in str(warning.message) for warning in caught))


def result(name: str, ours_s: float, floor_s: float, device_name: str, target: str) -> None:
    print(
        f"RESULT {name} ours={ours_s * 1e3:.1f}ms floor={floor_s * 1e3:.1f}ms "
        f"ratio={floor_s / ours_s:.2f} target={target} device={device_name!r}"
    )


# ----- PPO update ------------------------------------------------------------------------
def synthetic_round(device: torch.device) -> dict[str, torch.Tensor]:
    generator = torch.Generator(device=device).manual_seed(0)
    done = torch.zeros(STEPS, ENVS, dtype=torch.bool, device=device)
    done[-1] = True
    return {
        "obs": torch.randn(STEPS, ENVS, OBS_DIM, generator=generator, device=device),
        "actions": torch.randn(STEPS, ENVS, ACTION_DIM, generator=generator, device=device),
        "reward": torch.rand(STEPS, ENVS, generator=generator, device=device),
        "done": done,
    }


def our_ppo(
    device: torch.device, data: dict[str, torch.Tensor], precision: str, cuda_graph: bool = True
):
    policy = GaussianChunkPolicy(
        MLPEncoder(OBS_DIM, HIDDEN, "elu"), ACTION_DIM, ACTION_DIM, max_horizon=1
    )
    critic = ValueCritic(MLPEncoder(OBS_DIM, HIDDEN, "elu"), max_horizon=1)
    settings = OnPolicySettings(
        gamma=GAMMA, gae_lambda=LAM, clip_ratio=CLIP, value_loss_coef=VALUE_COEF,
        entropy_coef=ENTROPY_COEF, update_epochs=EPOCHS, num_minibatches=MINIBATCHES,
        learning_rate=LR, max_grad_norm=MAX_GRAD_NORM, normalize_advantages=True,
        cuda_graph=cuda_graph,
    )  # fmt: skip
    algorithm = PPO(
        policy, critic, settings, chunk=1, generator=torch.Generator().manual_seed(0),
        device=device, precision=precision,
    )  # fmt: skip
    steps, envs = STEPS, ENVS
    ones = torch.ones(steps, envs, dtype=torch.long, device=device)
    with torch.no_grad():
        flat_obs = data["obs"].view(-1, OBS_DIM)
        log_prob, _ = policy.chunk_log_prob(
            flat_obs, ones.view(-1), torch.zeros_like(ones.view(-1)),
            data["actions"].view(-1, 1, ACTION_DIM),
        )  # fmt: skip
    zeros = torch.zeros(steps, envs, device=device)
    false = torch.zeros(steps, envs, dtype=torch.bool, device=device)
    index = torch.arange(envs, device=device)
    batch = Trajectories(
        obs=data["obs"], plan_obs=data["obs"], actions=data["actions"].unsqueeze(2),
        chunk_offset=torch.zeros_like(ones), plan_horizon=ones, log_prob=log_prob.view(steps, envs),
        value=zeros, reward=data["reward"], env_reward=data["reward"], done=data["done"],
        timeout=false, success=false, executed_actions=ones, intervened=false, held=false,
        valid=~false, advantage=zeros, returns=zeros, task_id=torch.zeros_like(index),
        init_state_index=index, group_index=index, horizon=torch.ones_like(index),
        episode_success=torch.zeros_like(index, dtype=torch.bool), episode_return=zeros[0],
        episode_length=torch.full_like(index, steps), loss_mask=torch.ones(envs, device=device),
    )  # fmt: skip
    batch = algorithm.attach_values(batch)

    def run() -> None:
        algorithm.update(algorithm.compute_returns(batch))

    run.algorithm = algorithm  # type: ignore[attr-defined]  (what graphs it captured)
    return run


def graphs_captured(run: Callable[[], object]) -> str:
    """What a one-shot GPU run should see at once: whether the steps replayed graphs."""
    graphs = run.algorithm.step_graphs  # type: ignore[attr-defined]
    if graphs is None:
        return "none (eager)"
    sizes = sorted(size for size, _ in graphs.steps)
    return f"{len(sizes)} sizes {sizes}" + (" (a capture failed: eager)" if graphs.failed else "")


def floor_ppo(device: torch.device, data: dict[str, torch.Tensor]):
    """The least a PPO update of these sizes has to do, in plain torch."""

    def mlp(out: int) -> nn.Sequential:
        layers: list[nn.Module] = []
        width = OBS_DIM
        for size in HIDDEN:
            layers += [nn.Linear(width, size), nn.ELU()]
            width = size
        return nn.Sequential(*layers, nn.Linear(width, out)).to(device)

    actor, critic = mlp(ACTION_DIM), mlp(1)
    log_std = nn.Parameter(torch.zeros(ACTION_DIM, device=device))
    params = [*actor.parameters(), *critic.parameters(), log_std]
    optimizer = torch.optim.Adam(params, lr=LR, fused=True)
    obs, actions, reward, done = data["obs"], data["actions"], data["reward"], data["done"]

    def log_prob_of(mean: torch.Tensor, taken: torch.Tensor) -> torch.Tensor:
        z = (taken - mean) * torch.exp(-log_std)
        return (-0.5 * z.pow(2) - log_std - 0.9189385332046727).sum(-1)

    with torch.no_grad():
        old_log_prob = log_prob_of(actor(obs), actions)

    def run() -> None:
        with torch.no_grad():
            values = critic(obs).squeeze(-1)
            advantages = torch.zeros_like(reward)
            running = torch.zeros(ENVS, device=device)
            for t in reversed(range(STEPS)):
                next_values = values[t + 1] if t + 1 < STEPS else torch.zeros_like(running)
                alive = 1.0 - done[t].float()
                delta = reward[t] + GAMMA * next_values * alive - values[t]
                running = delta + GAMMA * LAM * alive * running
                advantages[t] = running
            returns = advantages + values
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        rows = STEPS * ENVS
        flat = (obs.view(rows, -1), actions.view(rows, -1), old_log_prob.view(-1),
                advantages.view(-1), returns.view(-1))  # fmt: skip
        for _ in range(EPOCHS):
            order = torch.randperm(rows, device=device)
            for part in order.chunk(MINIBATCHES):
                o, a, old, adv, ret = (t.index_select(0, part) for t in flat)
                ratio = torch.exp(log_prob_of(actor(o), a) - old)
                surrogate = torch.max(-adv * ratio, -adv * ratio.clamp(1 - CLIP, 1 + CLIP)).mean()
                value_loss = 0.5 * (critic(o).squeeze(-1) - ret).pow(2).mean()
                entropy = (0.5 + 0.9189385332046727 + log_std).sum()
                loss = surrogate + VALUE_COEF * value_loss - ENTROPY_COEF * entropy
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM)
                optimizer.step()

    return run


# ----- rollout ----------------------------------------------------------------------------
ROLLOUT_COPIES, ROLLOUT_STEPS = 256, 8  # 40-action episodes in chunks of 5


def rollout_pair(device: torch.device, cuda_graph: bool = True):
    env = BuiltinReachEnv(num_envs=ROLLOUT_COPIES, max_episode_steps=40)
    policy = GaussianChunkPolicy(MLPEncoder(env.obs_shape[0], HIDDEN, "elu"), 7, 7, 5)
    settings = OnPolicySettings(rollout_cuda_graph=cuda_graph)
    algorithm = PPO(policy, None, settings, chunk=5, device=device)
    horizons = assign_horizons([5], ROLLOUT_COPIES)
    count = env.init_states(0).shape[0]
    states = [copy % count for copy in range(ROLLOUT_COPIES)]
    init = env.init_states(0)[torch.tensor(states)]

    def ours() -> None:
        run_round(env, algorithm, 0, states, horizons, ROLLOUT_STEPS)

    ours.algorithm = algorithm  # type: ignore[attr-defined]  (what graphs it captured)
    device_horizons = horizons.to(device)

    def floor() -> None:
        obs = env.reset(0, init)
        for _ in range(ROLLOUT_STEPS):
            plan, _ = policy.sample_plan(obs.to(device), device_horizons, chunk=5)
            step = env.step(plan[:, :5].cpu())
            obs = step.obs

    return ours, floor


def decisions_captured(run: Callable[[], object]) -> str:
    graphs = run.algorithm.decision_graphs  # type: ignore[attr-defined]
    if graphs is None:
        return "none (eager)"
    return f"{graphs.graphs} phases" + (" (a capture failed: eager)" if graphs.failed else "")


# ----- RLPD -------------------------------------------------------------------------------
RLPD_BATCH, RLPD_ROUNDS = 256, 50


def rlpd_pair(device: torch.device, cuda_graph: bool = True):
    # The defaults: 10 critics of [256, 256], cta_ratio 2, rounds replayed as a CUDA graph.
    settings = RLPDSettings(cuda_graph=cuda_graph)
    learner = RLPDLearner(OBS_DIM, ACTION_DIM, settings, device)
    online, demo = ReplayBuffer(100_000, device), ReplayBuffer(20_000, device)
    for buffer, rows in ((online, 100_000), (demo, 20_000)):
        buffer.add({
            "obs": torch.randn(rows, OBS_DIM), "action": torch.rand(rows, ACTION_DIM) * 2 - 1,
            "reward": (torch.rand(rows) < 0.1).float(), "next_obs": torch.randn(rows, OBS_DIM),
            "terminal": torch.rand(rows) < 0.05, "intervened": torch.zeros(rows, dtype=torch.bool),
        })  # fmt: skip
    sampler = MixedSampler(online, demo, RLPD_BATCH, fields=learner.fields)
    # Where the buffers are, as RLPDAlgorithm draws: a CPU generator's rows would cross
    # to the GPU each batch, a copy that waits for the update in flight.
    generator = torch.Generator(device).manual_seed(0)

    def sample() -> dict[str, torch.Tensor]:
        return sampler.sample(generator)

    def ours() -> None:
        for _ in range(RLPD_ROUNDS):
            learner.update(sample)

    hidden = settings.hidden_sizes
    members, batch = settings.critic_ensemble, RLPD_BATCH
    actor = [(OBS_DIM, hidden[0]), (hidden[0], hidden[1]), (hidden[1], 2 * ACTION_DIM)]
    critic = [(OBS_DIM + ACTION_DIM, hidden[0]), (hidden[0], hidden[1]), (hidden[1], 1)]

    def products(layers, ensemble: int, backward_inputs: bool, weight_grads: bool):
        shapes = [(ensemble, batch, n_in, n_out) for n_in, n_out in layers]
        if backward_inputs:
            shapes += [(ensemble, batch, n_out, n_in) for n_in, n_out in layers[1:]]
        if weight_grads:
            shapes += [(ensemble, n_in, batch, n_out) for n_in, n_out in layers]
        return shapes

    critic_step = (
        products(actor, 1, False, False) + products(critic, members, False, False)  # target
        + products(critic, members, True, True)  # the critics' loss and gradients
    )  # fmt: skip
    actor_step = products(critic, members, True, False) + products(actor, 1, True, True)
    shapes = critic_step * settings.cta_ratio + actor_step
    operands = [
        (torch.randn(e, m, k, device=device), torch.randn(e, k, n, device=device),
         torch.empty(e, m, n, device=device))
        for e, m, k, n in shapes
    ]  # fmt: skip

    def floor() -> None:
        for _ in range(RLPD_ROUNDS):
            for left, right, out in operands:
                torch.bmm(left, right, out=out)

    return ours, floor


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--cpu-smoke", action="store_true",
        help="run every part once on the CPU at 1/16 of the envs (checks the script, "
        "measures nothing worth reporting)",
    )  # fmt: skip
    args = parser.parse_args()
    global ENVS
    if args.cpu_smoke:
        device, name, ENVS, args.repeats = torch.device("cpu"), "cpu (smoke)", ENVS // 16, 1
    elif not torch.cuda.is_available():
        print("bench/gpu.py: no CUDA device here (torch sees none); nothing to measure")
        return 0
    else:
        device = torch.device("cuda", 0)
        name = torch.cuda.get_device_name(device)
    enable_fast_matmul(device)
    print(f"device={name!r} torch={torch.__version__} envs={ENVS} steps={STEPS} hidden={HIDDEN}")
    data = synthetic_round(device)
    floor = floor_ppo(device, data)
    ours = our_ppo(device, data, "fp32")
    ours_s, floor_s = median_pair(ours, floor, device, args.repeats)
    result("gpu_ppo_update", ours_s, floor_s, name, ">= 0.9")
    print(f"gpu_ppo_update step graphs: {graphs_captured(ours)}")
    print(f"gpu_ppo_update syncs: ours {syncs(ours, device)}, floor {syncs(floor, device)}")
    ours_s, floor_s = median_pair(our_ppo(device, data, "bf16"), floor, device, args.repeats)
    result("gpu_ppo_update_bf16", ours_s, floor_s, name, "(fp32 floor)")
    eager = our_ppo(device, data, "fp32", cuda_graph=False)
    ours_s, floor_s = median_pair(eager, floor, device, args.repeats)
    result("gpu_ppo_update_eager", ours_s, floor_s, name, "(cuda_graph=false)")
    print(f"gpu_ppo_update ops (eager): ours {ops(eager)}, floor {ops(floor)}")
    ours, floor = rollout_pair(device)
    ours_s, floor_s = median_pair(ours, floor, device, args.repeats)
    result("gpu_rollout", ours_s, floor_s, name, ">= 0.9")
    print(f"gpu_rollout decision graphs: {decisions_captured(ours)}")
    print(f"gpu_rollout syncs ({ROLLOUT_STEPS} steps): ours {syncs(ours, device)}, "
          f"floor {syncs(floor, device)}")  # fmt: skip
    eager, floor = rollout_pair(device, cuda_graph=False)
    ours_s, floor_s = median_pair(eager, floor, device, args.repeats)
    result("gpu_rollout_eager", ours_s, floor_s, name, "(rollout.cuda_graph=false)")
    print(f"gpu_rollout ops (eager, env included): ours {ops(eager)}, floor {ops(floor)}")
    ours, floor = rlpd_pair(device)
    ours_s, floor_s = median_pair(ours, floor, device, args.repeats)
    result("gpu_rlpd_updates", ours_s, floor_s, name, ">= 0.7")
    print(f"gpu_rlpd_updates syncs ({RLPD_ROUNDS} rounds): ours {syncs(ours, device)}")
    eager, floor = rlpd_pair(device, cuda_graph=False)
    ours_s, floor_s = median_pair(eager, floor, device, args.repeats)
    result("gpu_rlpd_updates_eager", ours_s, floor_s, name, "(cuda_graph=false)")
    print(f"gpu_rlpd_updates ops (eager): ours {ops(eager)}, floor {ops(floor)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
