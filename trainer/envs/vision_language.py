"""Observations for vision-language-action policies, packed into one flat tensor.

A VLA policy sees camera images, the task's instruction and the robot's proprio state.
Every collector, buffer and transport in the trainer carries an observation as one
tensor per copy, so an env that offers such observations packs them into one row:
``[images (num_images x C x H x W, floats in [0, 1]), proprio (proprio_dim), task id]``.
The instruction travels as the task id; its text is a fact of the env
(``VisionLanguageSpec.instructions``), tokenised once per task by the policy.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class VisionLanguageSpec:
    """How an env's packed rows split into images, proprio and task id."""

    image_shape: tuple[int, int, int]  # C, H, W
    num_images: int
    proprio_dim: int
    instructions: tuple[str, ...]  # one per task id

    @property
    def image_size(self) -> int:
        channels, height, width = self.image_shape
        return channels * height * width

    @property
    def row_size(self) -> int:
        return self.num_images * self.image_size + self.proprio_dim + 1

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> VisionLanguageSpec:
        return cls(
            image_shape=tuple(data["image_shape"]),  # type: ignore[arg-type]
            num_images=int(data["num_images"]),
            proprio_dim=int(data["proprio_dim"]),
            instructions=tuple(data["instructions"]),
        )

    def pack(
        self, images: torch.Tensor, proprio: torch.Tensor, task_ids: torch.Tensor
    ) -> torch.Tensor:
        """``images [N, num_images, C, H, W]`` (uint8, or floats in [0, 1]), ``proprio
        [N, proprio_dim]``, ``task_ids [N]`` -> ``[N, row_size]`` float32."""
        rows = images.shape[0]
        if images.dtype == torch.uint8:
            images = images.float().div_(255.0)
        parts = [images.reshape(rows, -1).float(), proprio.float(), task_ids.float()[:, None]]
        return torch.cat(parts, dim=1)

    def unpack(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``[N, row_size]`` -> images ``[N, num_images, C, H, W]``, proprio ``[N, P]``,
        task ids ``[N]`` (long). Views of ``rows`` where they can be."""
        if rows.shape[-1] != self.row_size:
            raise ValueError(
                f"vision-language rows have {self.row_size} values, got {rows.shape[-1]}"
            )
        split = self.num_images * self.image_size
        images = rows[:, :split].view(rows.shape[0], self.num_images, *self.image_shape)
        proprio = rows[:, split : split + self.proprio_dim]
        return images, proprio, rows[:, -1].round().long()
