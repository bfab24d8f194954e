"""``python -m trainer run CONFIG.yaml [key=value ...] [--resume]``: train in this process.

Registered with the ``python -m trainer`` dispatcher through ``add_parser``; also runs on
its own as ``python -m trainer.commands.run CONFIG.yaml ...``. Without a ``cluster:``
placement the run trains in this process; with one, this process drives the placed Ray
processes (trainer.runtime).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainer.cluster import ClusterConfigError
from trainer.config.errors import ConfigError
from trainer.config.loading import load_config
from trainer.config.path_roots import paths_outside, roots_from_environment
from trainer.config.schema import ExperimentConfig
from trainer.devices import describe_device
from trainer.link.environment import LINK_VARIABLES, Link
from trainer.link.reporter import RunReporter, report_failure, run_link
from trainer.models.card import model_card
from trainer.runner.build import compute_device
from trainer.runner.checkpoints import UnreadableCheckpoint
from trainer.runner.loop import NothingToResumeError, has_checkpoint, run_folder
from trainer.runner.on_policy_runner import OnPolicyRunner
from trainer.runner.stop_request import StopRequest
from trainer.runtime.distributed_run import distributed_plan
from trainer.runtime.ray_calls import connect
from trainer.whereabouts import ProcessReport

EXIT_OK = 0
EXIT_BAD_CONFIG = 2
EXIT_STOPPED = 130  # the shell's code for a run ended by a signal


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="experiment YAML file (see examples/)")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="override config keys, e.g. algorithm.name=grpo runner.iterations=50",
    )
    parser.add_argument(
        "--output-dir",
        help="write metrics, checkpoints and the resolved config here (overrides "
        "runner.output_dir; the control plane gives each run its own folder)",
    )
    resume = parser.add_mutually_exclusive_group()
    resume.add_argument(
        "--resume",
        action="store_true",
        help="continue from the latest checkpoint in the output folder",
    )
    resume.add_argument(
        "--resume-if-any",
        action="store_true",
        help="continue from the latest checkpoint if there is one, else start afresh",
    )
    parser.set_defaults(handler=main)


def add_parser(subcommands: Any) -> argparse.ArgumentParser:
    """Register ``run`` on an ``argparse`` subparsers object."""
    parser = subcommands.add_parser(
        "run",
        help="train a policy: in this process, or on Ray where cluster: places it",
        description="Train a policy from an experiment config, in this process or, with a "
        "cluster: placement, as placed Ray processes driven from this one; with a progress "
        "bar, JSONL metrics and checkpoints under runner.output_dir.",
    )
    _configure(parser)
    return parser


def main(args: argparse.Namespace) -> int:
    if not logging.getLogger().handlers:
        # Warnings (e.g. the group filter giving up) get one readable line each.
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    # Before the link spools into it: a folder given to a new run holds nothing yet.
    taken = output_folder_taken(args)
    # Launched by the control plane, the run reports over the link; alone, this is a no-op.
    # The control plane gives the run's folder (--output-dir), where the link spools.
    with run_link(Path(args.output_dir) if args.output_dir else None) as link:
        if taken is not None:
            print(f"config error: {taken}", file=sys.stderr)
            report_failure(link, taken)
            return EXIT_BAD_CONFIG
        return _train(args, link)


def output_folder_taken(args: argparse.Namespace) -> ConfigError | None:
    """A new run's `--output-dir` must be empty (or not there yet): a folder that holds
    anything was not made for it, and its checkpoints would be taken for the run's own.
    Only a resume (--resume, --resume-if-any) continues in a folder that holds files."""
    if not args.output_dir or args.resume or args.resume_if_any:
        return None
    folder = Path(args.output_dir)
    if folder.is_dir() and not any(folder.iterdir()):
        return None
    if not folder.exists() and not folder.is_symlink():
        return None
    return ConfigError.single(
        "--output-dir",
        f"{folder} already holds files (or is not a folder): a new run starts in an empty "
        "folder; continue a run in it with --resume",
    )


def start_trained_first(
    config: ExperimentConfig, roots: list[Path] | None = None, inside: Path | None = None
) -> ExperimentConfig:
    """`actor.model.init_from` naming a run config (.yaml): that run's folder, trained
    here first when it has no checkpoint yet (SFT, then RL, in one command). With
    `roots` (a run the control plane launched), the nested config's own paths are held
    to them and its problems are counted, not echoed (the file is not the user's own
    text, and a run's events are shown to every viewer); with `inside` (the launching
    run's folder), it trains there, in `start/`, never where its own config says."""
    where = config.actor.model.init_from
    if not where or not where.endswith((".yaml", ".yml")):
        return config
    try:
        start = load_config(where)
        if roots is not None and (outside := paths_outside(start, roots)):
            raise ConfigError(outside)
    except ConfigError as error:  # its problems, named as the file's own
        told = f"{len(error.problems)} problem(s)" if roots is not None else str(error)
        raise ConfigError.single("actor.model.init_from", f"{where}: {told}") from None
    if inside is not None:
        runner = start.runner.model_copy(update={"output_dir": str(inside / "start")})
        start = start.model_copy(update={"runner": runner})
    folder = run_folder(start)
    if not has_checkpoint(start):
        print(f"training the run it starts from first: {where} into {folder}", flush=True)
        runner = OnPolicyRunner(start)
        try:
            runner.learn()
        finally:
            runner.close()
    data = config.model_dump(mode="json")
    data["actor"]["model"]["init_from"] = str(folder)
    return ExperimentConfig.model_validate(data)


def _train(args: argparse.Namespace, link: Link) -> int:
    try:
        overrides = list(args.overrides)
        if args.output_dir:
            # JSON text is a YAML double-quoted string: any path reads back as itself.
            overrides.append(f"runner.output_dir={json.dumps(args.output_dir)}")
        config = load_config(args.config, overrides)
        roots = roots_from_environment()
        if roots is not None and (outside := paths_outside(config, roots)):
            raise ConfigError(outside)
        inside = Path(args.output_dir) if args.output_dir else None
        config = start_trained_first(config, roots, inside)
        resume = args.resume or (args.resume_if_any and has_checkpoint(config))
        reporter = RunReporter(link, config)
        plan = distributed_plan(config)
        if plan is not None:
            return _train_distributed(config, plan, resume, reporter)
        reporter.started(resume=resume)
        device = describe_device(compute_device(config))
        _placed(reporter, [ProcessReport.here("actor", 0, 0, device=device)])
        if config.algorithm.name == "rlpd":
            from trainer.runner.rlpd_runner import RLPDRunner  # only what the config needs

            runner = RLPDRunner(
                config, on_metrics=reporter.on_metrics, on_checkpoint=reporter.on_checkpoint,
                link=link, on_recovery=reporter.recovered, on_episodes=reporter.on_episodes,
                on_video=reporter.episode_video,
            )  # fmt: skip
        else:
            runner = OnPolicyRunner(
                config, on_metrics=reporter.on_metrics, on_checkpoint=reporter.on_checkpoint,
                on_recovery=reporter.recovered, link=link, on_episodes=reporter.on_episodes,
                on_video=reporter.episode_video,
            )  # fmt: skip
            reporter.model(model_card(runner.algorithm.policy, config.actor.model))
        try:
            with StopRequest() as stop:
                history = runner.learn(resume=resume, should_stop=stop.is_set)
        finally:
            runner.close()
    except ConfigError as error:
        print(f"config error in {args.config}:", file=sys.stderr)
        for problem in error.problems:
            print(f"  {problem}", file=sys.stderr)
        report_failure(link, error)
        return EXIT_BAD_CONFIG
    except ClusterConfigError as error:
        print(f"placement error in {args.config}: {error}", file=sys.stderr)
        report_failure(link, error)
        return EXIT_BAD_CONFIG
    except (NothingToResumeError, UnreadableCheckpoint) as error:
        print(f"cannot resume: {error}", file=sys.stderr)
        report_failure(link, error)
        return EXIT_BAD_CONFIG
    last = history[-1] if history else {}
    files = f"metrics: {runner.metrics_log.path}; checkpoints: {runner.checkpoint_dir}"
    return _finish(reporter, stop, runner.iteration, last, files)


def _train_distributed(config, plan, resume: bool, reporter: RunReporter) -> int:
    """The same loop on the placement's actor ranks (trainer.runtime.distributed_run), or
    RLPD's learner and its acting env workers (trainer.runtime.rlpd_split)."""
    output_dir = run_folder(config)
    callbacks = {
        "on_metrics": reporter.on_metrics,
        "on_checkpoint": reporter.on_checkpoint,
        "on_placed": lambda ranks: _placed(reporter, ranks),
        "on_episodes": reporter.on_episodes,
    }
    if config.algorithm.name == "rlpd":
        from trainer.runtime.rlpd_split import check_rlpd_plan, train_rlpd_split

        check_rlpd_plan(plan)  # before the run is reported started
        train = train_rlpd_split
    else:
        from trainer.runtime.distributed_run import train_distributed

        train = train_distributed
        callbacks = {**callbacks, "on_model": reporter.model, "on_video": reporter.episode_video}
    # Env workers' robot links authenticate as this run's attempt, as its link does.
    link_env = {name: os.environ[name] for name in LINK_VARIABLES if name in os.environ}
    callbacks = {**callbacks, "on_event": reporter.link.event, "link_env": link_env,
                 "on_recovery": reporter.recovered}  # fmt: skip
    reporter.started(resume=resume)
    connect()  # first: joining Ray replaces the SIGTERM handler StopRequest installs
    with StopRequest() as stop:
        result = train(
            config, plan, output_dir, resume=resume, should_stop=stop.is_set, **callbacks
        )
    ranks = sum(1 for process in result.ranks if process.component == "actor")
    env_workers = len(result.ranks) - ranks
    where = f" on {ranks} actor rank(s)" + (
        f" and {env_workers} env worker(s)" if env_workers else ""
    )
    files = f"files: {output_dir}"
    return _finish(reporter, stop, result.iteration, result.last_metrics, files, where)


def _finish(
    reporter: RunReporter,
    stop: StopRequest,
    iteration: int,
    last_metrics: dict[str, float],
    files: str,
    where: str = "",
) -> int:
    """The run's last word, to the link and the terminal, in one process or placed."""
    total = reporter.total
    if stop.signal_name:
        reporter.stopped(iteration, stop.signal_name)
        print(
            f"stopped by {stop.signal_name} after {iteration}/{total} iterations; "
            f"checkpoint saved, continue with --resume; {files}"
        )
        return EXIT_STOPPED
    reporter.finished(iteration)
    success = last_metrics.get("rollout/success_rate")
    print(
        f"finished {iteration}/{total} iterations{where}"
        + (f", last success_rate {success:.3f}" if success is not None else "")
        + f"; {files}"
    )
    return EXIT_OK


def _placed(reporter: RunReporter, processes: list[ProcessReport]) -> None:
    reporter.placed([process.to_json() for process in processes])
    where = ", ".join(
        f"{p.component} {p.rank} on node {p.node_rank} (pid {p.pid})" for p in processes
    )
    print(f"placed: {where}", flush=True)


def run(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.commands.run")
    _configure(parser)
    args = parser.parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(run())
