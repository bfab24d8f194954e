"""``python -m trainer eval CHECKPOINT_OR_RUN [--config FROZEN] [--suite S] [--tasks 0,1]
[--states N]``: evaluate a checkpoint on the env's protocol (trainer.evaluation.protocol)
and write the per-task table as JSON and Markdown.

Launched by the control plane (an eval run), it reports over the link as a training run
does: started, progress per task, the table (`evaluated`), finished or failed. It then
evaluates with the source run's frozen config (`--config`), never with the one a
checkpoint file carries, which anyone who can write the run's folder could change: a
checkpoint whose own config disagrees with it on what runs where or what it reaches
(`BOUND_KEYS`) is refused."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import torch

from trainer.config.errors import ConfigError, ConfigIssue
from trainer.config.loading import load_config
from trainer.config.path_roots import paths_outside, roots_from_environment
from trainer.config.schema import ExperimentConfig
from trainer.envs.vector_env import VectorEnv
from trainer.evaluation.protocol import EvalTable, OneActionPlans, evaluate
from trainer.link.reporter import EvalReporter, report_failure, run_link
from trainer.runner.build import build_components, compute_device
from trainer.runner.checkpoints import (
    NoCheckpoint,
    UnreadableCheckpoint,
    find_checkpoint,
    load_checkpoint,
)
from trainer.videos.eval_videos import EvalVideos
from trainer.videos.recorder import EpisodeRecorder, can_record
from trainer.whereabouts import ProcessReport

EXIT_OK = 0
EXIT_BAD_INPUT = 2
# What a checkpoint's own config must say as the frozen one does: the process-level
# settings and placement (cluster), the robots, cameras and classifier it drives or
# reads (env.name, env.real_robot), and the model files it loads (actor.model.path).
BOUND_KEYS = (("cluster",), ("env", "name"), ("env", "real_robot"), ("actor", "model", "path"))


def add_parser(subcommands: Any) -> argparse.ArgumentParser:
    parser = subcommands.add_parser(
        "eval",
        help="evaluate a checkpoint on every task and init state",
        description="Evaluate a checkpoint (a .pt file, a run folder or its checkpoints "
        "folder: its latest checkpoint) on every task x every fixed init state with "
        "deterministic actions; writes eval-<suite or env>.json and .md.",
    )
    parser.add_argument("checkpoint", help="checkpoint file, run folder or checkpoints folder")
    parser.add_argument(
        "--config",
        help="the run's frozen config to evaluate with (the control plane passes it); "
        "without it, the one the checkpoint carries",
    )
    parser.add_argument("--suite", help="LIBERO suite to evaluate on (default: the run's)")
    parser.add_argument(
        "--tasks",
        help="comma-separated task ids (default: every task of --suite; without --suite, "
        "the run's tasks)",
    )
    parser.add_argument("--states", type=int, help="init states per task (default: all)")
    parser.add_argument("--num-envs", type=int, help="episodes at once (default: the run's)")
    parser.add_argument("--env-workers", type=int, help="env worker processes (default: the run's)")
    parser.add_argument("--output", help="folder for the tables (default: the run folder)")
    parser.set_defaults(handler=main)
    return parser


def requested_tasks(text: str | None) -> list[int] | None:
    """`--tasks 0,3` as ids (None: every task); ConfigError naming `--tasks`."""
    if text is None:
        return None
    parts = [part.strip() for part in text.split(",") if part.strip()]
    bad = [part for part in parts if not part.isdigit()]
    if bad or not parts:
        shown = ", ".join(bad) if bad else "nothing"
        raise ConfigError.single("--tasks", f"not task ids: {shown} (give e.g. 0,3)")
    tasks = [int(part) for part in parts]
    twice = sorted({task for task in tasks if tasks.count(task) > 1})
    if twice:
        raise ConfigError.single("--tasks", f"listed twice: {', '.join(map(str, twice))}")
    return tasks


def run_config(state: dict[str, Any], frozen: str | None) -> ExperimentConfig:
    """The config the checkpoint's run ran with: its frozen config (`--config`), the
    checkpoint's own agreeing with it on `BOUND_KEYS`; without one, the checkpoint's."""
    carried = ExperimentConfig.model_validate(state["config"])
    if frozen is None:
        return carried
    config = load_config(frozen)
    ours, theirs = config.model_dump(mode="json"), carried.model_dump(mode="json")
    problems = []
    for path in BOUND_KEYS:
        if _at(ours, path) != _at(theirs, path):
            problems.append(ConfigIssue(
                "eval.checkpoint_config",
                "the checkpoint's own config says otherwise than the run's frozen config "
                "here; a checkpoint is evaluated with its run's config, and this one was "
                "not written by that run",
                path,
            ))  # fmt: skip
    if problems:
        raise ConfigError(problems)
    return config


def _at(data: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        data = data.get(key) if isinstance(data, dict) else None
    return data


def eval_config(
    state: dict[str, Any], args: argparse.Namespace, frozen: str | None = None
) -> ExperimentConfig:
    """The run's own config (`run_config`), with what the evaluation changes: one
    rollout per state (no groups), and the suite, batch and worker counts asked for.
    Without --num-envs, a batch is no larger than --states (a padded slot costs as much
    as a real one)."""
    if args.states is not None and args.states < 1:
        raise ConfigError.single("--states", f"must be at least 1, not {args.states}")
    config = run_config(state, frozen)
    env_changes: dict[str, Any] = {"interventions": {"source": "none"}}  # the policy alone
    if args.suite:
        if config.env.name != "libero":
            raise ConfigError.single("--suite", f"{config.env.name} has no suites")
        env_changes["suite"] = args.suite
    if args.num_envs:
        env_changes["num_parallel_envs"] = args.num_envs
    elif args.states is not None and args.states < config.env.num_parallel_envs:
        env_changes["num_parallel_envs"] = args.states
    if args.env_workers is not None:
        env_changes["num_workers"] = args.env_workers
    else:
        num_envs = env_changes.get("num_parallel_envs", config.env.num_parallel_envs)
        env_changes["num_workers"] = min(config.env.num_workers, num_envs)
    data = config.model_dump(mode="json")
    data["env"].update(env_changes)
    if args.suite:
        data["env"]["max_episode_steps"] = None  # the suite's own limit
    data["algorithm"].update(group_size=1, data_batch_size=1, reward_filter={"enabled": False})
    # The checkpoint holds the policy: neither the run's start (init_from) nor its
    # demos (an SFT run's; its policy evaluates as any on-policy one) are read again.
    data["algorithm"]["name"] = "grpo" if config.algorithm.name == "bc" else config.algorithm.name
    data["actor"]["model"]["init_from"] = None
    data["cluster"] = None
    return ExperimentConfig.model_validate(data)


def main(args: argparse.Namespace) -> int:
    # Launched by the control plane, the evaluation reports over the link and spools in
    # its own folder (--output); alone, the link does nothing.
    with run_link(Path(args.output) if args.output else None) as link:
        return _evaluate(args, EvalReporter(link))


def _evaluate(args: argparse.Namespace, reporter: EvalReporter) -> int:
    try:
        asked = requested_tasks(args.tasks)
        path = find_checkpoint(Path(args.checkpoint))
        state = load_checkpoint(path)
        config = eval_config(state, args, args.config)
        roots = roots_from_environment()
        if roots is not None and (outside := paths_outside(config, roots)):
            raise ConfigError(outside)
        reporter.started(
            {"name": config.name, "env": config.env.name, "suite": config.env.suite,
             "checkpoint": str(path), "iteration": int(state["iteration"]),
             "tasks": asked, "states": args.states},
            ProcessReport.here("actor", 0, 0).to_json(),
        )  # fmt: skip
        evaluated = _policy_and_env(config, state)
    except (NoCheckpoint, UnreadableCheckpoint, ConfigError) as error:
        return _refused(error, reporter)
    policy, env, task_ids, horizons, chunk = evaluated
    try:
        # A named suite is evaluated whole (the protocol); else the run's own tasks.
        every = list(range(env.num_tasks))
        tasks = asked if asked is not None else every if args.suite else task_ids
        unknown = [task for task in tasks if task >= env.num_tasks]
        if unknown:
            problem = ConfigIssue(
                "eval.tasks",
                f"{config.env.name} has tasks 0..{env.num_tasks - 1}, not "
                + ", ".join(map(str, unknown)),
                ("--tasks",),
            )
            return _refused(ConfigError([problem]), reporter)
        done: list[int] = []
        reporter.task_done(0, len(tasks))

        def task_done(result: Any) -> None:
            done.append(result.task_id)
            reporter.task_done(len(done), len(tasks))

        output = Path(args.output) if args.output else path.parent.parent
        videos = _eval_videos(config, env, output, int(state["iteration"]), reporter)
        try:
            results = evaluate(policy, env, tasks, horizons, chunk, args.states, task_done,
                               videos)  # fmt: skip
        finally:
            if videos is not None:
                videos.recorder.close()
    finally:
        env.close()
    table = EvalTable(
        env=config.env.name, suite=config.env.suite, checkpoint=str(path),
        iteration=int(state["iteration"]), horizons=horizons, tasks=results,
    )  # fmt: skip
    output.mkdir(parents=True, exist_ok=True)
    stem = f"eval-{config.env.suite or config.env.name}-iter{table.iteration}"
    (output / f"{stem}.json").write_text(json.dumps(table.to_json(), indent=2))
    (output / f"{stem}.md").write_text(table.to_markdown())
    reporter.evaluated(table.to_json())
    print(table.to_markdown())
    print(f"wrote {output / stem}.json and .md")
    return EXIT_OK


def _eval_videos(config: ExperimentConfig, env: VectorEnv, output: Path, iteration: int,
                 reporter: EvalReporter) -> EvalVideos | None:  # fmt: skip
    """The first episodes of each task and horizon as videos, when the evaluated run
    recorded videos (`runner.videos`): `per_task` of each cell, in `<output>/videos`."""
    videos = config.runner.videos
    if not videos.every or not can_record():
        return None

    def report(record: dict[str, Any]) -> None:
        reporter.link.event("episode", record)

    recorder = EpisodeRecorder(
        output / "videos", videos.fps, videos.max_mb * 2**20, on_episode=report
    )
    return EvalVideos(env, recorder, videos.per_task, videos.size, iteration)


def _policy_and_env(
    config: ExperimentConfig, state: dict[str, Any]
) -> tuple[Any, VectorEnv, list[int], list[int], int]:
    """The checkpoint's policy as the protocol runs it, the env, the run's tasks, the
    horizons to evaluate and the chunk. An RLPD actor acts one action at a time: a plan
    of horizon 1."""
    if config.algorithm.name == "rlpd":
        from trainer.algorithms.rlpd import RLPDLearner, shares_encoder
        from trainer.runner.rlpd_runner import build_env, rlpd_settings

        env = build_env(config)
        device = compute_device(config)
        # The actor's encoder as the checkpoint has it: a run's config from before the
        # shared encoder does not say it had none.
        shared = shares_encoder(state["learner"])
        settings = dataclasses.replace(rlpd_settings(config), shared_encoder=shared)
        learner = RLPDLearner(env.obs_shape, env.action_dim, settings, device)
        learner.load_state_dict(state["learner"])
        tasks = list(config.env.task_ids or range(env.num_tasks))
        return OneActionPlans(learner.actor, env.action_dim), env, tasks, [1], 1
    components = build_components(config, torch.Generator().manual_seed(0))
    components.algorithm.load_state_dict(state["algorithm"])
    horizons = sorted(set(config.rollout.action_horizons_pattern))
    chunk = config.actor.model.num_action_chunks
    return components.algorithm.policy, components.env, components.task_ids, horizons, chunk


def _refused(error: Exception, reporter: EvalReporter) -> int:
    print(f"cannot evaluate: {error}", file=sys.stderr)
    report_failure(reporter.link, error)
    return EXIT_BAD_INPUT
