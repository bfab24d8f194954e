"""The π0 family: flow-matching VLAs through transformers' own classes
(`PI0ForConditionalGeneration`, `PI0Processor`; the class `lerobot/pi0_base` loads into),
from a local folder whose `config.json` says `model_type: pi0`, and a tiny random one of
the same family saved the way a user's folder is, for tests and CPU demos.

What a family provides (`trainer.models.vla.families`): how its folder is recognised,
how it is loaded (model and processor, offline), and how a tiny one is written. This
module writes no model code: the prefix (PaliGemma), the action expert (a Gemma), the
prefix's KV cache reused across denoising steps and the denoising loop are the library's;
`flow_sde` turns that loop into a stochastic policy with exact log-probs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainer.models.vla.tiny import fitted_tokenizer

MODEL_TYPE = "pi0"


def load_pi0(folder: Path) -> tuple[Any, Any]:
    """The model and its processor from the folder alone (the caller checked it and set
    the hub offline)."""
    from transformers import PI0ForConditionalGeneration, PI0Processor

    processor = PI0Processor.from_pretrained(folder, local_files_only=True)
    # sdpa whatever the folder asks: the expert's block mask is a 4D pattern.
    model = PI0ForConditionalGeneration.from_pretrained(
        folder, local_files_only=True, attn_implementation="sdpa"
    )
    return model, processor


def build_tiny_pi0(
    folder: Path,
    sentences: Sequence[str],
    image_size: int = 32,
    patch_size: int = 16,
    width: int = 64,
    expert_width: int = 32,
    layers: int = 2,
    chunk_size: int = 50,
    max_dim: int = 32,
    seed: int = 0,
) -> Path:
    """Write a tiny π0 and its processor to `folder` (`save_pretrained`): a PaliGemma
    prefix of `width`, an action expert of `expert_width` with as many layers (it attends
    to the prefix's keys and values, so the two share the layer count, the key-value heads
    and the head size), `chunk_size` actions of `max_dim` dims, the tokenizer fitted to
    `sentences` (PI0Processor adds its location and segmentation tokens)."""
    import torch
    from transformers import PI0Config, PI0ForConditionalGeneration, PI0Processor
    from transformers.utils import logging

    try:  # PIL's image processor, without the torchvision warning
        from transformers import SiglipImageProcessorPil as ImageProcessor
    except ImportError:  # pragma: no cover - older transformers
        from transformers import SiglipImageProcessor as ImageProcessor

    logging.disable_progress_bar()
    logging.set_verbosity_error()
    if image_size % patch_size:
        raise ValueError(f"image_size {image_size} is not a multiple of patch_size {patch_size}")
    images = ImageProcessor(
        size={"height": image_size, "width": image_size},
        image_seq_length=(image_size // patch_size) ** 2,
    )
    processor = PI0Processor(
        image_processor=images, tokenizer=fitted_tokenizer(sentences), chunk_size=chunk_size,
        max_state_dim=max_dim,
    )  # fmt: skip
    heads, head_dim = 2, width // 2
    vocab = len(processor.tokenizer)
    tower = {"num_hidden_layers": layers, "num_attention_heads": heads}
    config = PI0Config(
        vlm_config={
            "model_type": "paligemma",
            "text_config": {"model_type": "gemma", "vocab_size": vocab, "hidden_size": width,
                            "intermediate_size": 2 * width, "num_key_value_heads": 1,
                            "head_dim": head_dim, **tower},
            "vision_config": {"model_type": "siglip_vision_model", "hidden_size": width,
                              "intermediate_size": 2 * width, "image_size": image_size,
                              "patch_size": patch_size, "vision_use_head": False, **tower},
            "projection_dim": width,
            "image_token_id": processor.image_token_id,
        },
        dit_config={"model_type": "gemma", "vocab_size": vocab, "hidden_size": expert_width,
                    "intermediate_size": 2 * expert_width, "num_key_value_heads": 1,
                    "head_dim": head_dim, **tower},
        chunk_size=chunk_size, max_state_dim=max_dim, max_action_dim=max_dim,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = PI0ForConditionalGeneration(config)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def build_full_size_pi0(folder: Path, sentences: Sequence[str], seed: int = 0) -> Path:
    """Write a π0 of the shipped size (`PI0Config()`'s defaults: a PaliGemma 3B prefix at
    224 pixels, a 300 M Gemma expert; about 3.3 B parameters) with random weights in
    bf16, and a processor whose tokenizer is fitted to `sentences`: what a benchmark
    measures on a GPU without downloading a checkpoint."""
    import torch
    from transformers import PI0Config, PI0ForConditionalGeneration, PI0Processor

    try:
        from transformers import SiglipImageProcessorPil as ImageProcessor
    except ImportError:  # pragma: no cover - older transformers
        from transformers import SiglipImageProcessor as ImageProcessor

    config = PI0Config()
    vision = config.vlm_config.vision_config
    images = ImageProcessor(
        size={"height": vision.image_size, "width": vision.image_size},
        image_seq_length=(vision.image_size // vision.patch_size) ** 2,
    )
    processor = PI0Processor(
        image_processor=images, tokenizer=fitted_tokenizer(sentences),
        chunk_size=config.chunk_size, max_state_dim=config.max_state_dim,
    )  # fmt: skip
    config.vlm_config.image_token_id = processor.image_token_id  # the fitted tokenizer's
    torch.manual_seed(seed)
    model = PI0ForConditionalGeneration._from_config(config, dtype=torch.bfloat16)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder
