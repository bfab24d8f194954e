"""A policy's model card, for the run page: what it is and how much of it trains."""

from __future__ import annotations

from typing import Any

from torch import nn

from trainer.config.schema import ModelConfig


def model_card(policy: nn.Module, model: ModelConfig) -> dict[str, Any]:
    """Kind, parameter counts and, for a VLA, its family, base folder and fingerprint,
    LoRA settings, frozen parts and action tokens."""
    card: dict[str, Any] = {
        "kind": model.kind,
        "parameters": sum(p.numel() for p in policy.parameters()),
        "trainable_parameters": sum(p.numel() for p in policy.parameters() if p.requires_grad),
    }
    if model.kind != "vla":
        card["hidden_sizes"] = list(model.hidden_sizes)
        return card
    backbone = policy.backbone  # type: ignore[attr-defined]
    lora = model.lora
    card.update(
        family=str(backbone.config.model_type),
        base=policy.base_model(),  # type: ignore[operator]
        lora=lora.model_dump() if lora is not None else None,
        freeze_vision=model.freeze_vision,
        gradient_checkpointing=model.gradient_checkpointing,
        action_bins=model.num_bins,
        image_size=list(policy.pixel_size),  # type: ignore[attr-defined]
    )
    return card
