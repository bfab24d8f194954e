"""What every VLA family's policy shares: a base model from a folder, named with its
fingerprint by the checkpoints that train on it; one network in train and eval mode
(no dropout); a vision tower that can be frozen."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from trainer.models.vla.folder import fingerprint

# Where families keep their vision tower, for `freeze_vision`.
VISION_TOWER_NAMES = ("vision_tower", "vision_model", "visual")


class FolderPolicy(nn.Module):
    """A policy around `backbone` (a transformers model loaded from its folder)."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.base_folder = Path(backbone.name_or_path)
        self._base_fingerprint: str | None = None

    def train(self, mode: bool = True) -> FolderPolicy:
        """The caller's mode for every module; dropout stays off in both (see
        ``switch_off_dropout``), so train and eval run the same network."""
        super().train(mode)
        switch_off_dropout(self)
        return self

    def base_model(self) -> dict[str, str]:
        """The base folder a checkpoint names, and its fingerprint (computed once)."""
        if self._base_fingerprint is None:
            self._base_fingerprint = fingerprint(self.base_folder)
        return {"path": str(self.base_folder), "sha256": self._base_fingerprint}

    def check_base_model(self, saved: dict[str, str] | None) -> None:
        """A checkpoint's policy fits this base only if its base had the same weights."""
        if saved is None:
            return
        if saved["sha256"] != self.base_model()["sha256"]:
            raise ValueError(
                f"the checkpoint was trained on {saved['path']} (sha256 "
                f"{saved['sha256'][:12]}…); {self.base_folder} holds other weights"
            )

    def freeze_vision(self) -> None:
        tower = vision_tower(self.backbone)
        for parameter in tower.parameters():
            parameter.requires_grad_(False)

    def trainable_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)


def switch_off_dropout(module: nn.Module) -> None:
    """Dropout's probabilities set to 0 in ``module``: LoRA's and any of the backbone's.
    A rollout's log-probs must be the update's for the same weights (veRL runs its
    actor without dropout for the same reason), and a mode switch alone would not hold:
    the adapters are built in train mode, and callers set modes as they need."""
    for inner in module.modules():
        if isinstance(inner, nn.modules.dropout._DropoutNd):
            inner.p = 0.0
        # transformers' attention layers keep their dropout as a float they apply in train
        # mode (Gemma's `attention_dropout`, SigLIP's `dropout`).
        for name in ("attention_dropout", "dropout"):
            if isinstance(getattr(inner, name, None), float):
                setattr(inner, name, 0.0)


def vision_tower(backbone: nn.Module) -> nn.Module:
    """The backbone's vision tower, wherever its family keeps it (π0's is in its
    PaliGemma prefix)."""
    for inner in (backbone, getattr(backbone, "model", None)):
        if inner is None:
            continue
        for holder in (inner, getattr(inner, "model", None), getattr(inner, "vlm", None)):
            tower = next(
                (getattr(holder, name) for name in VISION_TOWER_NAMES
                 if isinstance(getattr(holder, name, None), nn.Module)),
                None,
            )  # fmt: skip
            if tower is not None:
                return tower
    raise ValueError(f"found no vision tower ({', '.join(VISION_TOWER_NAMES)}) in the model")
