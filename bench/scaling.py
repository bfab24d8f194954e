"""Distributed stepping: does a run with placed env workers step its envs as fast as the
bare envs do, and does placing actors cost more than starting bare Ray actors?

`scaling_1worker`, `scaling_2workers`: env steps per second of a distributed run (one
actor rank, its copies split over 1 or 2 placed env workers; the run's own `charts/SPS`,
env actions executed per second of rollout, median of the iterations after the first)
against the same env stepped with random actions in 1 or 2 plain processes, each with
its share of the copies, in the same run (baseline). The env: LIBERO's first
libero_spatial task when LIBERO is installed, else the built-in env with enough
`physics_substeps` that a step costs about what a simulator's does (printed). Target
ratio >= 0.9 each.

`scaling_pipelined`: env steps per second of the 2-worker run with
`rollout.pipeline_stages=2` (the policy decides one worker's actions while the other
simulates) against the same run with the stages off, in the same run: the built-in env
with `--substeps`, and a policy that replans every action and whose inference costs
about what a step does (`--policy-width`; both printed), the case pipelining is for.

`placed_actor_start`: seconds from a plan of 16 processes on a 4-node
`ray.cluster_utils` cluster to all 16 actors ready through `create_placed_actors` (node
pinning, runtime env, start deadline) against starting 16 bare Ray actors of the same
class on the same cluster (baseline); median of the repeats. Target ratio <= 1.2.

    python bench/scaling.py [--substeps 400] [--repeats 3] [--iterations 5]
                            [--policy-width 2048] [--pipelined-copies 64]
                            [--only scaling|pipelined|start]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.ray_cluster import labelled_ray_cluster  # noqa: E402
from trainer.config.loading import load_config  # noqa: E402

COPIES = 8  # the rank's env copies: env.num_parallel_envs (PPO groups of one)
STEP_SECONDS = 6.0  # how long each baseline process steps


def env_config(
    substeps: int, libero: bool, workers: int, iterations: int, extra: tuple[str, ...] = (),
    copies: int = COPIES,
):  # fmt: skip
    base = ROOT / "examples" / ("libero_spatial_ppo.yaml" if libero else "builtin_ppo.yaml")
    overrides = [
        f"env.num_parallel_envs={copies}", f"algorithm.data_batch_size={copies}",
        "algorithm.group_size=1", "algorithm.name=ppo", "env.task_ids=[0]",
        f"runner.iterations={iterations}", "runner.progress=false", "runner.torch_threads=1",
        "runner.checkpoint_every=1000",
        "env.num_workers=0",
        "cluster={num_nodes: 1, component_placement: "
        f"{{actor: '0', env: '0:0-{workers - 1}'}}}}",
    ]  # fmt: skip
    if libero:
        overrides += ["env.max_episode_steps=60"]
    else:
        overrides += [f"env.physics_substeps={substeps}"]
    return load_config(base, [*overrides, *extra])


def heavy_policy(width: int) -> tuple[str, ...]:
    """A policy that replans every action with wide layers: inference per decision
    comparable to a simulator's step (a VLA's case, scaled to this machine)."""
    return (
        "actor.model.num_action_chunks=1", "rollout.action_horizons_pattern=[1]",
        f"actor.model.hidden_sizes=[{width},{width},{width}]",
    )  # fmt: skip


def inference_ms(config) -> float:
    import torch

    from trainer.envs.registry import make_vector_env
    from trainer.models.encoders import MLPEncoder
    from trainer.models.policy import GaussianChunkPolicy
    from trainer.runner.build import env_options

    env = make_vector_env(config.env.name, num_envs=1, **env_options(config))
    (obs_dim,), action_dim = env.obs_shape, env.action_dim
    env.close()
    torch.set_num_threads(1)
    encoder = MLPEncoder(obs_dim, tuple(config.actor.model.hidden_sizes))
    policy = GaussianChunkPolicy(encoder, action_dim, action_dim, 1)
    copies = config.env.num_parallel_envs // 2
    obs = torch.randn(copies, obs_dim)
    horizons = torch.ones(copies, dtype=torch.long)
    policy.sample_plan(obs, horizons)
    started = time.perf_counter()
    for _ in range(20):
        policy.sample_plan(obs, horizons)
    return (time.perf_counter() - started) / 20 * 1000


def ours(config, output_dir: Path) -> float:
    from trainer.runtime.distributed_run import distributed_plan, train_distributed

    rates = []
    train_distributed(
        config, distributed_plan(config), output_dir,
        on_metrics=lambda it, m: rates.append(m["charts/SPS"]) if it > 1 else None,
    )  # fmt: skip
    return statistics.median(rates)


def _step_plainly(config_dict: dict, copies: int, seconds: float, out) -> None:
    import torch

    from trainer.config.schema import ExperimentConfig
    from trainer.envs.registry import make_vector_env
    from trainer.runner.build import env_options

    torch.set_num_threads(1)
    config = ExperimentConfig.model_validate(config_dict)
    env = make_vector_env(config.env.name, num_envs=copies, **env_options(config))
    env.reset(0, env.init_states(0)[:copies])
    chunk = config.actor.model.num_action_chunks
    out.put("ready")
    executed, started = 0, time.monotonic()
    while time.monotonic() - started < seconds:
        actions = torch.rand(copies, chunk, env.action_dim) * 2 - 1
        executed += int(env.step(actions).executed_actions.sum())
    out.put(executed / (time.monotonic() - started))
    env.close()


def baseline(config, workers: int) -> float:
    """The same env copies stepped with random actions in `workers` plain processes."""
    context = mp.get_context("spawn")
    queue = context.Queue()
    shares = [COPIES // workers + (1 if w < COPIES % workers else 0) for w in range(workers)]
    settings = config.model_dump(mode="json")
    processes = [
        context.Process(target=_step_plainly, args=(settings, n, STEP_SECONDS, queue))
        for n in shares
    ]
    for process in processes:
        process.start()
    replies = [queue.get(timeout=600) for _ in range(2 * workers)]
    for process in processes:
        process.join()
    return sum(r for r in replies if r != "ready")


def step_cost_ms(config) -> float:
    import torch

    from trainer.envs.registry import make_vector_env
    from trainer.runner.build import env_options

    copies = config.env.num_parallel_envs
    env = make_vector_env(config.env.name, num_envs=copies, **env_options(config))
    env.reset(0, env.init_states(0)[:1].repeat(copies, 1))
    actions = torch.zeros(copies, config.actor.model.num_action_chunks, env.action_dim)
    started = time.perf_counter()
    for _ in range(20):
        env.step(actions)
    env.close()
    return (time.perf_counter() - started) / 20 * 1000


class Probe:
    """The actor class both sides of `placed_actor_start` start."""

    def ready(self) -> bool:
        return True


def actor_start(repeats: int) -> tuple[float, float]:
    import ray

    from trainer.cluster import cluster_from_dict, resolve_placement
    from trainer.runtime.ray_placement import create_placed_actors

    plan = resolve_placement(cluster_from_dict({"num_nodes": 4}), {"probe": "0-3:0-15"})
    probe = ray.remote(Probe)
    ours_s, bare_s = [], []
    with labelled_ray_cluster([{"num_cpus": 4}] * 4):
        for _ in range(repeats):
            started = time.perf_counter()
            placed = create_placed_actors(probe, plan, timeout_s=300)
            ours_s.append(time.perf_counter() - started)
            for actor in placed:
                ray.kill(actor.handle)
            started = time.perf_counter()
            bare = [probe.options(num_cpus=0).remote() for _ in range(16)]
            ray.get([actor.__ray_ready__.remote() for actor in bare], timeout=300)
            bare_s.append(time.perf_counter() - started)
            for actor in bare:
                ray.kill(actor)
    return statistics.median(ours_s), statistics.median(bare_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--substeps", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--policy-width", type=int, default=2048)
    parser.add_argument("--pipelined-copies", type=int, default=64)
    parser.add_argument(
        "--only", choices=["scaling", "pipelined", "start"], help="one part of the benchmark"
    )
    args = parser.parse_args()
    parts = [args.only] if args.only else ["scaling", "pipelined", "start"]
    try:
        from trainer.envs.libero_setup import check_libero_installed

        check_libero_installed()
        libero = True
    except Exception:  # noqa: BLE001 - any reason LIBERO is not usable: the built-in env
        libero = False
    results = []
    probe = env_config(args.substeps, libero, 1, args.iterations)
    what = "LIBERO libero_spatial task 0" if libero else f"built-in, {args.substeps} substeps"
    print(f"env: {what}; one step of {COPIES} copies: {step_cost_ms(probe):.1f} ms", flush=True)
    with labelled_ray_cluster([{"num_cpus": 4}]), tempfile.TemporaryDirectory() as tmp:
        for workers in (1, 2) if "scaling" in parts else ():
            config = env_config(args.substeps, libero, workers, args.iterations)
            ours_rates, base_rates = [], []
            for repeat in range(args.repeats):
                ours_rates.append(ours(config, Path(tmp) / f"w{workers}-{repeat}"))
                base_rates.append(baseline(config, workers))
                print(
                    f"{workers} worker(s), repeat {repeat + 1}: ours {ours_rates[-1]:,.0f} "
                    f"baseline {base_rates[-1]:,.0f} env steps/s",
                    flush=True,
                )
            ratios = [o / b for o, b in zip(ours_rates, base_rates, strict=True)]
            name = "scaling_1worker" if workers == 1 else "scaling_2workers"
            results.append(
                (name, statistics.median(ours_rates), statistics.median(base_rates),
                 statistics.median(ratios), "steps/s", "higher")
            )  # fmt: skip
        if "pipelined" in parts:
            # The built-in env, whose step cost the substeps set, so that inference and
            # simulation cost about the same (LIBERO's step dwarfs any CPU policy).
            heavy = heavy_policy(args.policy_width)
            copies = args.pipelined_copies
            plain = env_config(args.substeps, False, 2, args.iterations, heavy, copies)
            staged = env_config(
                args.substeps, False, 2, args.iterations, (*heavy, "rollout.pipeline_stages=2"),
                copies,
            )  # fmt: skip
            print(
                f"built-in env, {copies} copies, {args.substeps} substeps: "
                f"{step_cost_ms(plain):.1f} ms per step; "
                f"policy [{args.policy_width}] x 3 replanning every action: "
                f"{inference_ms(plain):.1f} ms per decision of half the copies",
                flush=True,
            )
            staged_rates, plain_rates = [], []
            for repeat in range(args.repeats):
                staged_rates.append(ours(staged, Path(tmp) / f"staged-{repeat}"))
                plain_rates.append(ours(plain, Path(tmp) / f"plain-{repeat}"))
                print(
                    f"pipelined, repeat {repeat + 1}: 2 stages {staged_rates[-1]:,.1f}, "
                    f"no stages {plain_rates[-1]:,.1f} env steps/s",
                    flush=True,
                )
            ratios = [o / b for o, b in zip(staged_rates, plain_rates, strict=True)]
            results.append(
                ("scaling_pipelined", statistics.median(staged_rates),
                 statistics.median(plain_rates), statistics.median(ratios), "steps/s", "higher")
            )  # fmt: skip
    if "start" in parts:
        ours_s, bare_s = actor_start(args.repeats)
        results.append(("placed_actor_start", ours_s, bare_s, ours_s / bare_s, "s", "lower"))
    for name, ours_value, base_value, ratio, unit, better in results:
        print(
            f"RESULT bench={name} ours={ours_value:.3f} baseline={base_value:.3f} "
            f"ratio={ratio:.3f} unit={unit} better={better}"
        )


if __name__ == "__main__":
    main()
