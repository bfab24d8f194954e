"""Vision-language-action policies: a transformers VLM from a local folder, wrapped as a
``ChunkedPolicy`` with discrete action tokens (``policy``), its folder checks and
fingerprint (``folder``), the action bins (``action_bins``) and a tiny model of a real
family for tests and CPU demos (``tiny``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer.envs.vision_language import VisionLanguageSpec
from trainer.models.vla.action_bins import ActionBins
from trainer.models.vla.families import PI0, family_of
from trainer.models.vla.folder import ModelFolderError, check_folder, fingerprint, load_folder
from trainer.models.vla.policy import VLAChunkPolicy

__all__ = [
    "ActionBins",
    "ModelFolderError",
    "VLAChunkPolicy",
    "build_vla_policy",
    "check_folder",
    "fingerprint",
]


def build_vla_policy(
    model: Any, spec: VisionLanguageSpec, env_action_dim: int, max_horizon: int
) -> VLAChunkPolicy:
    """The policy an ``actor.model`` section of kind vla describes, for an env's
    vision-language observations: backbone and processor from ``model.path``, LoRA
    adapters, a frozen vision tower and gradient checkpointing as it asks."""
    folder = Path(model.path)
    if model.build_tiny and not (folder / "config.json").is_file():
        write_tiny_once(folder, spec)
    if family_of(folder) == PI0:
        # The π0 family loads and samples (trainer.models.vla.pi0, flow_sde); runs do not
        # train it yet: said before any weights are read.
        raise ModelFolderError(
            f"{folder} holds a π0 (flow-matching) model; runs train the action-token family "
            "only for now"
        )
    backbone, processor = load_folder(folder)
    if model.gradient_checkpointing:
        backbone.gradient_checkpointing_enable()
    if model.lora is not None:
        from peft import LoraConfig, inject_adapter_in_model

        lora = model.lora
        adapters = LoraConfig(
            r=lora.rank,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=list(lora.target_modules),
        )
        backbone = inject_adapter_in_model(adapters, backbone)
        for name, parameter in backbone.named_parameters():
            parameter.requires_grad_("lora_" in name)
    # Bounds fitted to demos are set once the demos are read (trainer.runner.build), or
    # loaded with a checkpoint; [-1, 1] until then.
    low, high = (-1.0, 1.0) if model.action_bounds == "demos" else model.action_bounds
    bins = ActionBins(model.num_bins, [low] * model.action_dim, [high] * model.action_dim)
    policy = VLAChunkPolicy(
        backbone, processor, spec, bins, model.action_dim, env_action_dim, max_horizon,
        model.temperature,
    )  # fmt: skip
    if model.freeze_vision:
        policy.freeze_vision()
    return policy


def write_tiny_once(folder: Path, spec: VisionLanguageSpec) -> None:
    """A tiny model at ``folder``, written beside it and renamed into place, so ranks and
    workers that start together never read a half-written folder."""
    import os
    import shutil
    import tempfile

    from trainer.models.vla.tiny import build_tiny_vla

    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    build_tiny_vla(staging, spec.instructions, image_size=spec.image_shape[1])
    try:
        os.rename(staging, folder)
    except OSError:  # another process put its copy there first
        shutil.rmtree(staging, ignore_errors=True)
