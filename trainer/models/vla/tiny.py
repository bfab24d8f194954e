"""A tiny random-initialised VLA backbone of a real family, saved the way a user's
checkpoint folder is: tests and CPU demos load it through exactly a user's path.

The family is PaliGemma (a SigLIP vision tower, a Gemma decoder; pi0's backbone): a
fixed number of image tokens per picture in front of the prompt, which a batched rollout
fills with one scatter. The tokenizer is fitted to the tasks' sentences, so the vocabulary
(and the embedding table) stays small.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>", "<unk>", "<image>")


def build_tiny_vla(
    folder: Path,
    sentences: Sequence[str],
    image_size: int = 64,
    patch_size: int = 16,
    width: int = 64,
    layers: int = 2,
    seed: int = 0,
    intermediate: int | None = None,
) -> Path:
    """Write a tiny PaliGemma and its processor to ``folder`` (``save_pretrained``);
    ``sentences``: what its tokenizer must know (the tasks' instructions); ``width``,
    ``layers`` and ``intermediate`` (2 x width by default) size both towers (the
    benchmark's larger models)."""
    import torch
    from transformers import (
        GemmaConfig,
        PaliGemmaConfig,
        PaliGemmaForConditionalGeneration,
        PaliGemmaProcessor,
        SiglipImageProcessor,
        SiglipVisionConfig,
    )
    from transformers.utils import logging

    logging.disable_progress_bar()
    logging.set_verbosity_error()
    if image_size % patch_size:
        raise ValueError(f"image_size {image_size} is not a multiple of patch_size {patch_size}")
    tokenizer = fitted_tokenizer(sentences)
    image_tokens = (image_size // patch_size) ** 2
    image_processor = SiglipImageProcessor(
        size={"height": image_size, "width": image_size}, image_seq_length=image_tokens
    )
    processor = PaliGemmaProcessor(image_processor=image_processor, tokenizer=tokenizer)
    heads = max(width // 64, 1) if width >= 256 else max(width // 32, 1)
    config = PaliGemmaConfig(
        vision_config=SiglipVisionConfig(
            hidden_size=width,
            intermediate_size=intermediate or 2 * width,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            image_size=image_size,
            patch_size=patch_size,
        ),
        text_config=GemmaConfig(
            vocab_size=len(processor.tokenizer),
            hidden_size=width,
            intermediate_size=intermediate or 2 * width,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=1,
            head_dim=width // heads,
        ),
        image_token_index=processor.image_token_id,
        projection_dim=width,
    )
    torch.manual_seed(seed)
    model = PaliGemmaForConditionalGeneration(config)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def fitted_tokenizer(sentences: Sequence[str]) -> Any:
    """A word-level tokenizer that knows `sentences` (lower-cased) and the special tokens:
    a vocabulary, and so an embedding table, as small as the tasks allow."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel(unk_token="<unk>"))
    words.normalizer = normalizers.Lowercase()
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    words.train_from_iterator(
        list(sentences), trainers.WordLevelTrainer(special_tokens=list(SPECIAL_TOKENS))
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=words, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
        unk_token="<unk>",
    )  # fmt: skip
