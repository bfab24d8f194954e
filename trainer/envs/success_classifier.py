"""A learned success detector on a robot's camera, as HIL-SERL's reward classifier: a
small CNN that reads one camera frame and says whether the task is solved, so a real
arm's episodes can end in success without an operator's mark.

It learns from labelled frames in a folder, the way HIL-SERL records them (the operator
presses a key while the scene shows success): `success/` and `failure/` beside each
other, any number of JPEG or PNG pictures in each. Frames are resized to a square
`image_size` in one batched tensor operation. A saved classifier keeps its image size,
its threshold and the figures it was trained to (`python -m trainer
train-classifier`); `env.real_robot.success_classifier` uses it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

PICTURES = ("*.jpg", "*.jpeg", "*.png")
LABELS = {"success": 1.0, "failure": 0.0}


class SuccessClassifier(nn.Module):
    """Three strided convolutions, then each channel averaged over the picture: where in
    the frame a feature shows matters to the convolutions, the picture's size to none."""

    def __init__(self, image_size: int = 64, features: int = 64) -> None:
        super().__init__()
        self.image_size, self.features = image_size, features
        widths = (3, 16, 32, features)
        layers: list[nn.Module] = []
        for width_in, width_out in zip(widths, widths[1:], strict=False):
            layers += [nn.Conv2d(width_in, width_out, 3, stride=2, padding=1), nn.ReLU()]
        self.convolutions = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(features, 1)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        """Logits [B] of frames [B, 3, S, S] in [0, 1]."""
        return self.head(self.convolutions(frames)).squeeze(-1)

    def prepare(self, pictures: Sequence[np.ndarray] | torch.Tensor) -> torch.Tensor:
        """[H, W, 3] uint8 pictures (or a [B, H, W, 3] uint8 tensor) as the network's
        input: [B, 3, S, S] floats in [0, 1], resized together."""
        batch = pictures if isinstance(pictures, torch.Tensor) else torch.from_numpy(
            np.stack([np.asarray(picture) for picture in pictures])
        )  # fmt: skip
        frames = batch.permute(0, 3, 1, 2).float().div_(255.0)
        size = (self.image_size, self.image_size)
        if tuple(frames.shape[2:]) != size:
            frames = F.interpolate(frames, size=size, mode="bilinear", antialias=True,
                                   align_corners=False)  # fmt: skip
        return frames

    @torch.no_grad()
    def success_probability(self, pictures: Sequence[np.ndarray]) -> torch.Tensor:
        return torch.sigmoid(self(self.prepare(pictures)))


@dataclass(frozen=True)
class TrainedClassifier:
    model: SuccessClassifier
    threshold: float
    train_accuracy: float
    held_out_accuracy: float | None  # None when too few frames were left to hold out
    frames: dict[str, int]  # per label


def load_labelled_frames(folder: Path) -> tuple[list[np.ndarray], torch.Tensor]:
    """The pictures under `folder`/success and `folder`/failure, with their labels (1
    success, 0 failure). A folder without both kinds is an error naming what is missing."""
    from PIL import Image

    pictures: list[np.ndarray] = []
    labels: list[float] = []
    for name, label in LABELS.items():
        paths = sorted(p for pattern in PICTURES for p in (folder / name).glob(pattern))
        if not paths:
            raise ValueError(f"{folder / name}: no pictures ({', '.join(PICTURES)})")
        for path in paths:
            with Image.open(path) as picture:
                pictures.append(np.asarray(picture.convert("RGB")))
            labels.append(label)
    return pictures, torch.tensor(labels, device="cpu")


def train_success_classifier(
    folder: Path,
    image_size: int = 64,
    epochs: int = 30,
    learning_rate: float = 1e-3,
    threshold: float = 0.5,
    held_out: float = 0.2,
    seed: int = 0,
) -> TrainedClassifier:
    """Train on the labelled frames in `folder`, holding out a share of each label to
    report accuracy on frames it did not learn from. Classes are weighed equally (a
    recording has many more failure frames than success ones, as HIL-SERL's do)."""
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    pictures, labels = load_labelled_frames(folder)
    model = SuccessClassifier(image_size)
    frames = torch.cat([model.prepare([p]) for p in pictures])  # sizes may differ
    order = torch.randperm(len(labels), generator=generator)
    test = torch.zeros(len(labels), dtype=torch.bool, device="cpu")
    for label in LABELS.values():
        rows = order[labels[order] == label]
        test[rows[: math.floor(len(rows) * held_out)]] = True
    train = ~test
    positives = float(labels[train].sum())
    weight = torch.tensor(
        max(float(train.sum()) - positives, 1.0) / max(positives, 1.0), device="cpu"
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
    batch = 32
    train_rows = train.nonzero().squeeze(1)
    for _ in range(epochs):
        shuffled = train_rows[torch.randperm(len(train_rows), generator=generator)]
        for rows in shuffled.split(batch):
            loss = F.binary_cross_entropy_with_logits(
                model(frames[rows]), labels[rows], pos_weight=weight
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()

    def accuracy(chosen: torch.Tensor) -> float:
        with torch.no_grad():
            said = torch.sigmoid(model(frames[chosen])) >= threshold
        return float((said == labels[chosen].bool()).float().mean())

    return TrainedClassifier(
        model=model, threshold=threshold, train_accuracy=accuracy(train),
        held_out_accuracy=accuracy(test) if bool(test.any()) else None,
        frames={name: int((labels == value).sum()) for name, value in LABELS.items()},
    )  # fmt: skip


def save_classifier(trained: TrainedClassifier, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "kind": "success_classifier",
            "image_size": trained.model.image_size,
            "features": trained.model.features,
            "threshold": trained.threshold,
            "state": trained.model.state_dict(),
            "train_accuracy": trained.train_accuracy,
            "held_out_accuracy": trained.held_out_accuracy,
            "frames": trained.frames,
        },
        path,
    )


def load_classifier(path: Path) -> tuple[SuccessClassifier, float]:
    """The classifier saved at `path` and its threshold; a file that is not one is a
    ValueError naming it."""
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError) as error:
        raise ValueError(f"{path}: not a readable success classifier ({error})") from None
    if not isinstance(saved, dict) or saved.get("kind") != "success_classifier":
        raise ValueError(f"{path}: not a success classifier (python -m trainer train-classifier)")
    model = SuccessClassifier(saved["image_size"], saved["features"])
    model.load_state_dict(saved["state"])
    model.eval()
    return model, float(saved["threshold"])
