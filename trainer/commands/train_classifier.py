"""``python -m trainer train-classifier FOLDER --out FILE``: train a success classifier
on labelled camera frames (FOLDER/success/ and FOLDER/failure/, JPEG or PNG) for
`env.real_robot.success_classifier` (trainer/envs/success_classifier.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from trainer.envs.success_classifier import save_classifier, train_success_classifier


def add_parser(subcommands: Any) -> argparse.ArgumentParser:
    parser = subcommands.add_parser(
        "train-classifier",
        help="train a success classifier on labelled camera frames",
        description="Train a CNN that tells success frames from failure frames "
        "(FOLDER/success/, FOLDER/failure/) and save it for env.real_robot.success_classifier.",
    )
    parser.add_argument("folder", help="a folder with success/ and failure/ pictures")
    parser.add_argument("--out", required=True, help="where to write the classifier (.pt)")
    parser.add_argument("--image-size", type=int, default=64, help="side frames are resized to")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--threshold", type=float, default=0.5,
                        help="probability from which a frame is a success")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(handler=main)
    return parser


def main(args: argparse.Namespace) -> int:
    if not 0.0 < args.threshold < 1.0:
        print("--threshold: must be between 0 and 1", file=sys.stderr)
        return 2
    try:
        trained = train_success_classifier(
            Path(args.folder), image_size=args.image_size, epochs=args.epochs,
            threshold=args.threshold, seed=args.seed,
        )  # fmt: skip
    except ValueError as error:
        print(f"train-classifier: {error}", file=sys.stderr)
        return 2
    save_classifier(trained, Path(args.out))
    held_out = trained.held_out_accuracy
    print(
        f"{trained.frames['success']} success and {trained.frames['failure']} failure frames: "
        f"accuracy {trained.train_accuracy:.3f} on the frames learnt from, "
        + (f"{held_out:.3f} on those held out" if held_out is not None else "none held out")
        + f"; saved to {args.out}"
    )
    return 0
