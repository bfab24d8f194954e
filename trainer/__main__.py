"""`python -m trainer <command> ...`: a thin dispatcher over subcommand modules.

Each module in COMMAND_MODULES provides `add_parser(subcommands)`, which registers its
subcommand and sets `handler(args) -> exit status`. Add a command by adding its module.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

COMMAND_MODULES = (
    "trainer.cluster.cli",
    "trainer.commands.run",
    "trainer.commands.evaluate",
    "trainer.commands.tiny_vla",
    "trainer.commands.train_classifier",
    "trainer.runtime.discover_cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m trainer", description="Armature trainer")
    subcommands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).add_parser(subcommands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except BrokenPipeError:
        # The reader (e.g. `| head`) went away; that is not an error of ours.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silences the flush at exit
        return 0


if __name__ == "__main__":
    sys.exit(main())
