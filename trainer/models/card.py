"""A policy's model card, for the run page: what it is and how much of it trains."""

from __future__ import annotations

from typing import Any

from torch import nn

from trainer.config.schema import ModelConfig


def model_card(policy: nn.Module, model: ModelConfig) -> dict[str, Any]:
    """Kind, parameter counts and, for a VLA, its family, base folder and fingerprint,
    LoRA settings, frozen parts, and its action tokens (a π0: its action expert's size,
    chunk, denoising steps, noise method and normalisation)."""
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
    )
    if getattr(policy, "family", None) == "pi0":
        size = policy.processor.image_processor.size  # type: ignore[attr-defined]
        card.update(
            expert_parameters=sum(p.numel() for p in backbone.model.dit.parameters()),
            chunk_size=int(backbone.config.chunk_size),
            denoising_steps=model.flow.steps,
            noise=f"{model.flow.method} (Flow-SDE), level {model.flow.noise_level:g}"
            + ("" if model.flow.stochastic_steps == "all" else ", one step per decision"),
            normalisation=policy.normaliser.source,  # type: ignore[attr-defined]
            image_size=[int(size["height"]), int(size["width"])],
        )
        return card
    card.update(
        action_bins=model.num_bins,
        image_size=list(policy.pixel_size),  # type: ignore[attr-defined]
    )
    return card
