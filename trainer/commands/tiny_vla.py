"""``python -m trainer tiny-vla FOLDER [--family tokens|pi0] [--env builtin_reach]
[--image-size 64]``: write a tiny random-initialised VLA of a real family and its processor
to FOLDER, its tokenizer fitted to the env's task instructions: a PaliGemma backbone (the
action-token family) or a π0 (flow matching, transformers' PI0 classes). Tests and CPU
demos load it through the same path a user's own checkpoint folder takes
(``actor.model.path``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from trainer.envs.registry import make_vector_env
from trainer.models.vla.families import FAMILIES, PI0, TOKENS
from trainer.models.vla.pi0 import build_tiny_pi0
from trainer.models.vla.tiny import build_tiny_vla


def add_parser(subcommands: Any) -> argparse.ArgumentParser:
    parser = subcommands.add_parser(
        "tiny-vla",
        help="write a tiny VLA model folder for tests and CPU demos",
        description="Write a tiny random-initialised PaliGemma and its processor "
        "(save_pretrained), its tokenizer fitted to the env's task instructions.",
    )
    parser.add_argument("folder", help="where to write the model folder")
    parser.add_argument("--family", choices=FAMILIES, default=TOKENS, help="the model family")
    parser.add_argument("--env", default="builtin_reach", help="env whose instructions it reads")
    parser.add_argument("--image-size", type=int, default=64, help="image side in pixels")
    parser.add_argument("--width", type=int, default=64, help="hidden width of both towers")
    parser.add_argument("--layers", type=int, default=2, help="layers of both towers")
    parser.set_defaults(handler=main)
    return parser


def instructions(env_name: str, image_size: int) -> tuple[str, ...]:
    env = make_vector_env(env_name, num_envs=1, vision_language=True, image_size=image_size)
    try:
        assert env.vision_language is not None
        return env.vision_language.instructions
    finally:
        env.close()


def main(args: argparse.Namespace) -> int:
    sentences = instructions(args.env, args.image_size)
    build = build_tiny_pi0 if args.family == PI0 else build_tiny_vla
    folder = build(
        Path(args.folder), sentences, args.image_size, width=args.width, layers=args.layers
    )
    print(f"wrote a tiny {args.family} VLA for {len(sentences)} instructions to {folder}")
    return 0
