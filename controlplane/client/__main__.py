"""python -m controlplane.client submit EXPERIMENT.yaml [--wait] [--require GATE …]
python -m controlplane.client sweep EXPERIMENT.yaml SWEEP.yaml [--wait] [--require GATE …]

Exit codes: 0 success · 1 run failed · 2 usage error · 3 a gate failed · 4 run cancelled
· 5 timed out · 6 the control plane refused or could not be reached · 130 interrupted.
"""

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from controlplane.client import sweep_report
from controlplane.client.gates import GateSyntaxError, parse_gate
from controlplane.client.report import write_json, write_junit
from controlplane.client.submit import EXIT_USAGE, SubmitOptions, submit
from controlplane.client.sweep import SweepOptions, run_sweep

DEFAULT_URL = "http://127.0.0.1:8000"
EXIT_CODES = __doc__.split("\n\n", 1)[1]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m controlplane.client",
        description="Armature's CI client: launch a run and gate on its metrics.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    sub = commands.add_parser(
        "submit",
        help="create or update an experiment and launch a run",
        description="Create the experiment (or add a revision when its config changed), "
        "launch a run with an idempotency key and, with --wait, follow it and check gates.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub.add_argument("config", type=Path, help="the experiment's YAML config")
    _add_shared(sub)
    sub.add_argument("--description", default="", help="description when creating")
    sub.add_argument("--message", default="", help="revision message when the config changed")
    sub.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override, repeatable",
    )
    sub.add_argument(
        "--timeout",
        type=int,
        metavar="S",
        help="the run's time limit in seconds (enforced by the server)",
    )
    sub.add_argument(
        "--poll-interval",
        type=float,
        default=2.0,
        metavar="S",
        help="seconds between status checks (default %(default)s)",
    )
    sub.add_argument("--json-out", type=Path, metavar="PATH", help="write a JSON summary")
    sub.add_argument("--junit-out", type=Path, metavar="PATH", help="write a JUnit XML report")
    sub.add_argument(
        "--episodes",
        type=Path,
        metavar="DIR",
        help="when the run fails, times out or misses a gate: save its recorded episode "
        "videos (and episodes.json) to DIR, e.g. as the CI job's artifacts",
    )
    sweep = commands.add_parser(
        "sweep",
        help="create or update an experiment and search its settings",
        description="Create the experiment (or add a revision when its config changed), "
        "start a sweep of it with an idempotency key and, with --wait, follow its trials "
        "and check gates on the sweep's figures: best, complete, pruned, failed, trials.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sweep.add_argument("config", type=Path, help="the experiment's YAML config")
    sweep.add_argument("sweep", type=Path, help="the sweep's YAML: space, objective, budget")
    _add_shared(sweep)
    sweep.add_argument(
        "--poll-interval",
        type=float,
        default=5.0,
        metavar="S",
        help="seconds between status checks (default %(default)s)",
    )
    sweep.add_argument("--json-out", type=Path, metavar="PATH", help="write a JSON summary")
    sweep.add_argument(
        "--junit-out",
        type=Path,
        metavar="PATH",
        help="write a JUnit XML report (a case per trial and per gate)",
    )
    return parser  # fmt: skip


def _add_shared(command: argparse.ArgumentParser) -> None:
    """The options `submit` and `sweep` both take."""
    command.add_argument(
        "--url",
        default=os.environ.get("ARMATURE_URL") or DEFAULT_URL,
        help="control plane URL (env ARMATURE_URL; default %(default)s)",
    )
    command.add_argument(
        "--token",
        default=os.environ.get("ARMATURE_TOKEN"),
        help="API token arm_… (env ARMATURE_TOKEN)",
    )
    command.add_argument("--name", help="experiment name (default: the config's `name:`)")
    command.add_argument("--cluster", help="cluster to run on (default: the server's)")
    command.add_argument("--wait", action="store_true", help="follow it until it ends")
    command.add_argument(
        "--require",
        dest="gates",
        action="append",
        default=[],
        metavar="GATE",
        help="gate like 'success_rate>=0.8' (a sweep's: 'best>=0.6'), repeatable (needs --wait)",
    )
    command.add_argument("--idempotency-key", help="override the derived idempotency key")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)

    def usage_error(message: str) -> int:
        print(f"{parser.prog} {args.command}: error: {message}", file=sys.stderr)
        return EXIT_USAGE

    try:
        gates = [parse_gate(text) for text in args.gates]
    except GateSyntaxError as error:
        return usage_error(str(error))
    if gates and not args.wait:
        return usage_error("--require needs --wait (gates check the finished run's metrics)")
    if args.command == "sweep":
        return _sweep(args, gates, usage_error)
    if args.episodes and not args.wait:
        return usage_error("--episodes needs --wait (they are saved once the run has ended)")
    if not args.token:
        return usage_error("no API token: pass --token or set ARMATURE_TOKEN")
    if not args.config.is_file():
        return usage_error(f"no such config file: {args.config}")
    bad = [item for item in args.overrides if "=" not in item or item.startswith("=")]
    if bad:
        return usage_error(f"--set needs KEY=VALUE, got {', '.join(map(repr, bad))}")
    if args.timeout is not None and args.timeout <= 0:
        return usage_error("--timeout must be a positive number of seconds")
    if args.poll_interval <= 0:
        return usage_error("--poll-interval must be positive")

    options = SubmitOptions(
        config_path=args.config,
        url=args.url,
        token=args.token,
        name=args.name,
        description=args.description,
        message=args.message,
        cluster=args.cluster,
        overrides=args.overrides,
        wait=args.wait,
        timeout_s=args.timeout,
        gates=gates,
        poll_interval_s=args.poll_interval,
        idempotency_key=args.idempotency_key,
        episodes_dir=args.episodes,
    )
    outcome = submit(options, out=sys.stdout)
    if args.json_out:
        write_json(outcome, args.json_out)
    if args.junit_out:
        write_junit(outcome, args.junit_out)
    return outcome.exit_code


def _sweep(args: argparse.Namespace, gates: list, usage_error) -> int:
    if not args.token:
        return usage_error("no API token: pass --token or set ARMATURE_TOKEN")
    for path in (args.config, args.sweep):
        if not path.is_file():
            return usage_error(f"no such file: {path}")
    if args.poll_interval <= 0:
        return usage_error("--poll-interval must be positive")
    options = SweepOptions(
        config_path=args.config, sweep_path=args.sweep, url=args.url, token=args.token,
        name=args.name, cluster=args.cluster, wait=args.wait, gates=gates,
        poll_interval_s=args.poll_interval, idempotency_key=args.idempotency_key,
    )  # fmt: skip
    outcome = run_sweep(options, out=sys.stdout)
    if args.json_out:
        sweep_report.write_json(outcome, args.json_out)
    if args.junit_out:
        sweep_report.write_junit(outcome, args.junit_out)
    return outcome.exit_code


def _raise_interrupt(signum: int, frame: object) -> None:
    # CI systems stop a job with SIGTERM: treat it like Ctrl+C, so the run gets cancelled.
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _raise_interrupt)
    sys.exit(main())
