"""Vision-language-action policies from a local model folder, by family
(``families``): any transformers VLM given discrete action tokens (``policy``), or a π0
sampled through Flow-SDE (``pi0_policy``); the folder checks and fingerprint
(``folder``), the action bins (``action_bins``) and tiny models of real families for
tests and CPU demos (``tiny``, ``pi0``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer.envs.vision_language import VisionLanguageSpec
from trainer.models.vla.action_bins import ActionBins
from trainer.models.vla.families import PI0, family_of
from trainer.models.vla.flow_sde import FlowSDE
from trainer.models.vla.folder import ModelFolderError, check_folder, fingerprint, load_folder
from trainer.models.vla.folder_policy import vision_tower
from trainer.models.vla.pi0 import build_tiny_pi0
from trainer.models.vla.pi0_policy import Pi0ChunkPolicy
from trainer.models.vla.policy import VLAChunkPolicy

__all__ = [
    "ActionBins",
    "ModelFolderError",
    "Pi0ChunkPolicy",
    "VLAChunkPolicy",
    "build_vla_policy",
    "check_folder",
    "fingerprint",
]


def build_vla_policy(
    model: Any, spec: VisionLanguageSpec, env_action_dim: int, max_horizon: int
) -> VLAChunkPolicy | Pi0ChunkPolicy:
    """The policy an ``actor.model`` section of kind vla describes, for an env's
    vision-language observations: backbone and processor from ``model.path`` (a π0 or an
    action-token VLA, by the folder's family), LoRA adapters, a frozen vision tower and
    gradient checkpointing as it asks."""
    folder = Path(model.path)
    if model.build_tiny and not (folder / "config.json").is_file():
        write_tiny_once(folder, spec, model.tiny_family)
    backbone, processor = load_folder(folder)
    pi0 = family_of(folder) == PI0
    if model.gradient_checkpointing and pi0:
        # The vision tower only: recomputing the prefix's or the expert's layers in
        # backward would write their keys and values into the shared KV cache again.
        vision_tower(backbone).gradient_checkpointing_enable()
    elif model.gradient_checkpointing:
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
    policy: VLAChunkPolicy | Pi0ChunkPolicy
    if pi0:
        flow = FlowSDE(model.flow.steps, model.flow.noise_level, model.flow.stochastic_steps)
        try:
            policy = Pi0ChunkPolicy(
                backbone, processor, spec, env_action_dim, max_horizon, flow,
                model.flow.step_tokens,
            )  # fmt: skip
        except ValueError as error:
            raise ModelFolderError(f"{folder}: {error}") from None
        if model.freeze_vision:
            policy.freeze_vision()
        return policy
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


def write_tiny_once(folder: Path, spec: VisionLanguageSpec, family: str = "tokens") -> None:
    """A tiny model at ``folder``, written beside it and renamed into place, so ranks and
    workers that start together never read a half-written folder."""
    import os
    import shutil
    import tempfile

    from trainer.models.vla.tiny import build_tiny_vla

    build = build_tiny_pi0 if family == PI0 else build_tiny_vla
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    build(staging, spec.instructions, image_size=spec.image_shape[1])
    try:
        os.rename(staging, folder)
    except OSError:  # another process put its copy there first
        shutil.rmtree(staging, ignore_errors=True)
