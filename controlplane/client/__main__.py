"""python -m controlplane.client submit EXPERIMENT.yaml [--wait] [--require GATE …]

Exit codes: 0 success · 1 run failed · 2 usage error · 3 a gate failed · 4 run cancelled
· 5 timed out · 6 the control plane refused or could not be reached · 130 interrupted.
"""

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from controlplane.client.gates import GateSyntaxError, parse_gate
from controlplane.client.report import write_json, write_junit
from controlplane.client.submit import EXIT_USAGE, SubmitOptions, submit

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
    sub.add_argument(
        "--url",
        default=os.environ.get("ARMATURE_URL") or DEFAULT_URL,
        help="control plane URL (env ARMATURE_URL; default %(default)s)",
    )
    sub.add_argument(
        "--token",
        default=os.environ.get("ARMATURE_TOKEN"),
        help="API token arm_… (env ARMATURE_TOKEN)",
    )
    sub.add_argument("--name", help="experiment name (default: the config's `name:`)")
    sub.add_argument("--description", default="", help="description when creating")
    sub.add_argument("--message", default="", help="revision message when the config changed")
    sub.add_argument("--cluster", help="cluster to run on (default: the server's)")
    sub.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override, repeatable",
    )
    sub.add_argument("--wait", action="store_true", help="follow the run until it ends")
    sub.add_argument(
        "--timeout",
        type=int,
        metavar="S",
        help="the run's time limit in seconds (enforced by the server)",
    )
    sub.add_argument(
        "--require",
        dest="gates",
        action="append",
        default=[],
        metavar="GATE",
        help="metric gate like 'success_rate>=0.8', repeatable (needs --wait)",
    )
    sub.add_argument(
        "--poll-interval",
        type=float,
        default=2.0,
        metavar="S",
        help="seconds between status checks (default %(default)s)",
    )
    sub.add_argument("--idempotency-key", help="override the derived idempotency key")
    sub.add_argument("--json-out", type=Path, metavar="PATH", help="write a JSON summary")
    sub.add_argument("--junit-out", type=Path, metavar="PATH", help="write a JUnit XML report")
    sub.add_argument(
        "--episodes",
        type=Path,
        metavar="DIR",
        help="when the run fails, times out or misses a gate: save its recorded episode "
        "videos (and episodes.json) to DIR, e.g. as the CI job's artifacts",
    )
    return parser  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)

    def usage_error(message: str) -> int:
        print(f"{parser.prog} submit: error: {message}", file=sys.stderr)
        return EXIT_USAGE

    try:
        gates = [parse_gate(text) for text in args.gates]
    except GateSyntaxError as error:
        return usage_error(str(error))
    if gates and not args.wait:
        return usage_error("--require needs --wait (gates check the finished run's metrics)")
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


def _raise_interrupt(signum: int, frame: object) -> None:
    # CI systems stop a job with SIGTERM: treat it like Ctrl+C, so the run gets cancelled.
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _raise_interrupt)
    sys.exit(main())
