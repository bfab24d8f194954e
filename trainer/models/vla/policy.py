"""A vision-language model as a chunked policy: images and the task's instruction in,
a plan of discrete action tokens out, with exact log-probs (``ChunkedPolicy``).

One forward reads ``[image tokens, instruction tokens, a proprio token, plan queries]``
through the backbone's decoder. The queries are ``max_horizon x action_dim`` learned embeddings
(plus one for the plan's horizon); the decoder's output at each query is one action
token's logits over ``num_bins`` bins, so the whole plan is decoded in parallel, as in
OpenVLA-OFT. The tokens of a plan are independent given the prompt, so a chunk's
log-prob is the sum of its tokens' and is recomputed exactly by the same forward.

Every forward passes its attention pattern explicitly (``attention_pattern``): the
prompt attends to itself both ways, as PaliGemma was pretrained on its prefix, and the
queries attend to the prompt and to each other, never the prompt to the queries. Left
to the backbone, the pattern would follow the batch: PaliGemma's decoder is
bidirectional with no mask and causal once any row is padded. The network is
deterministic whatever mode its caller sets (no dropout), so a rollout's log-probs are
the update's.

The backbone comes through transformers' Auto classes; what is used of it is what
image-text-to-text families share: the input embeddings, ``get_image_features`` (one
feature per image token), the decoder, and the processor's tokenizer and image settings.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainer.envs.vision_language import VisionLanguageSpec
from trainer.models.interface import check_action_dims
from trainer.models.vla.action_bins import ActionBins
from trainer.models.vla.folder_policy import FolderPolicy

# Attention implementations that take an explicit [B, 1, Q, K] additive mask.
MASKED_ATTENTION = ("sdpa", "eager")
# The processor's `resample` (PIL's numbering, or torchvision's mode names) as torch's
# interpolation mode; "nearest-exact" is PIL's nearest (pixel centres).
RESAMPLE_MODES: dict[int | str, str] = {
    0: "nearest-exact", 2: "bilinear", 3: "bicubic",
    "nearest": "nearest-exact", "nearest-exact": "nearest-exact", "bilinear": "bilinear",
    "bicubic": "bicubic",
}  # fmt: skip


class VLAChunkPolicy(FolderPolicy):
    def __init__(
        self,
        backbone: nn.Module,
        processor: Any,
        spec: VisionLanguageSpec,
        bins: ActionBins,
        action_dim: int,
        env_action_dim: int,
        max_horizon: int,
        temperature: float = 1.0,
    ) -> None:
        """`temperature`: what the sampled tokens' logits are divided by; the log-probs
        are the tempered policy's, so rollout and update agree exactly. Behaviour
        cloning fits the untempered logits, and deterministic plans take the argmax."""
        super().__init__(backbone)
        check_action_dims(action_dim, env_action_dim)
        self.temperature = temperature
        self.spec = spec
        self.bins = bins
        self.action_dim, self.env_action_dim = action_dim, env_action_dim
        self.max_horizon = max_horizon
        self.image_token_id = int(processor.image_token_id)
        self.width = width = backbone.get_input_embeddings().embedding_dim
        queries = max_horizon * action_dim
        self.queries = nn.Parameter(torch.randn(queries, width) * 0.02)
        self.horizon_embedding = nn.Embedding(max_horizon + 1, width)
        nn.init.normal_(self.horizon_embedding.weight, std=0.02)
        # The robot's own state as one more token after the prompt (pi0's state token,
        # OpenVLA-OFT's proprio projector); none when the env has no proprio.
        self.proprio_projector = nn.Linear(spec.proprio_dim, width) if spec.proprio_dim else None
        self.action_head = nn.Linear(width, bins.num_bins)
        # Near-uniform tokens at first: exploration over the whole action range.
        nn.init.normal_(self.action_head.weight, std=0.01)
        nn.init.zeros_(self.action_head.bias)
        prompt_ids, prompt_mask = _prompt_table(processor, spec)
        self.register_buffer("prompt_ids", prompt_ids, persistent=False)
        self.register_buffer("prompt_mask", prompt_mask, persistent=False)
        settings = processor.image_processor
        size = settings.size
        self.pixel_size = (int(size["height"]), int(size["width"]))
        self.resize_mode = resize_mode(settings)
        mean = torch.tensor(settings.image_mean, dtype=torch.float32).view(1, 3, 1, 1)
        std = torch.tensor(settings.image_std, dtype=torch.float32).view(1, 3, 1, 1)
        self.register_buffer("pixel_mean", mean, persistent=False)
        self.register_buffer("pixel_std", std, persistent=False)
        implementation = getattr(backbone.get_decoder().config, "_attn_implementation", "sdpa")
        if implementation not in MASKED_ATTENTION:
            raise ValueError(
                f"the policy's attention pattern needs {' or '.join(MASKED_ATTENTION)} "
                f"attention; the model is set to {implementation}"
            )
        # One mode for the whole tree: from_pretrained leaves the backbone in eval mode,
        # in which transformers skips gradient checkpointing.
        self.train()

    # ----- the forward ---------------------------------------------------------------
    def pixel_values(self, images: torch.Tensor) -> torch.Tensor:
        """``[N, k, C, H, W]`` floats in [0, 1] -> the processor's pixel values
        ``[N * k, C, h, w]``: its resize and normalisation as one batch of tensor ops."""
        flat = images.flatten(0, 1)
        if tuple(flat.shape[-2:]) != self.pixel_size:
            flat = self._resize(flat)
        return (flat - self.pixel_mean) / self.pixel_std

    def _resize(self, images: torch.Tensor) -> torch.Tensor:
        """The processor's resize of 8-bit pictures, as PIL does it: its filter (SigLIP's
        is bicubic) antialiased (torch's antialiased kernels are PIL's), across then
        down, each pass clipped and rounded to 8 bits. The clipping of a pass's
        overshoot is what a one-pass float resize misses (up to 15 of 255 levels)."""
        height, width = self.pixel_size
        if self.resize_mode == "nearest-exact":
            return F.interpolate(images, size=(height, width), mode="nearest-exact")
        levels = images.mul(255).round()
        for size in ((levels.shape[-2], width), (height, width)):
            if tuple(levels.shape[-2:]) != size:
                levels = F.interpolate(levels, size=size, mode=self.resize_mode, antialias=True)
                levels = levels.clamp(0, 255).round()
        return levels / 255

    def plan_logits(self, obs: torch.Tensor, horizons: torch.Tensor) -> torch.Tensor:
        """``[B, max_horizon, action_dim, num_bins]`` float32 logits of the plan."""
        queries = self.queries.unsqueeze(0) + self.horizon_embedding(horizons.long()).unsqueeze(1)
        logits = self.action_head(self.read_queries(obs, queries))
        return logits.float().view(obs.shape[0], self.max_horizon, self.action_dim, -1)

    def read_queries(self, obs: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        """The decoder's last hidden states ``[B, Q, width]`` at ``queries [B or 1, Q,
        width]`` appended to the prompt ``[image tokens, instruction, proprio token]``."""
        images, proprio, task_ids = self.spec.unpack(obs)
        ids, mask = self.prompt_ids[task_ids], self.prompt_mask[task_ids]
        embeddings = self.backbone.get_input_embeddings()(ids)
        features = self.backbone.get_image_features(pixel_values=self.pixel_values(images))
        features = getattr(features, "pooler_output", features)
        image_slots = (ids == self.image_token_id).unsqueeze(-1)
        embeddings = embeddings.masked_scatter(image_slots, features.to(embeddings.dtype))
        batch = obs.shape[0]
        parts = [embeddings]
        if self.proprio_projector is not None:
            parts.append(self.proprio_projector(proprio).unsqueeze(1).to(embeddings.dtype))
        parts.append(queries.expand(batch, -1, -1).to(embeddings.dtype))
        inputs = torch.cat(parts, dim=1)
        prompt = inputs.shape[1] - queries.shape[1]  # image tokens, instruction, proprio
        mask = torch.cat([mask, mask.new_ones(batch, prompt - mask.shape[1])], dim=1)
        allowed = attention_pattern(mask, queries.shape[1])
        bias = torch.zeros(allowed.shape, dtype=inputs.dtype, device=inputs.device)
        bias = bias.masked_fill(~allowed, torch.finfo(inputs.dtype).min)
        positions = torch.cat([mask, mask.new_ones(batch, queries.shape[1])], dim=1)
        positions = (positions.cumsum(1) - 1).clamp(min=0)  # left padding: real tokens from 0
        hidden = self.backbone.get_decoder()(
            inputs_embeds=inputs, attention_mask=bias, position_ids=positions
        ).last_hidden_state
        return hidden[:, -queries.shape[1] :]

    # ----- the contract --------------------------------------------------------------
    @torch.no_grad()
    def sample_plan(
        self,
        obs: torch.Tensor,
        horizons: torch.Tensor,
        deterministic: bool = False,
        steps: int | None = None,
        chunk: int = 1,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A plan ``[B, steps, action_dim]`` of bin centres and the log-prob of each
        chunk of ``chunk`` actions over the env's dims ``[B, steps // chunk]``."""
        log_probs = self._tempered(self.plan_logits(obs, horizons)).log_softmax(-1)
        if steps is not None:
            log_probs = log_probs[:, :steps]
        batch, plan_steps = log_probs.shape[:2]
        if plan_steps % chunk:
            raise ValueError(f"a plan of {plan_steps} steps does not split into chunks of {chunk}")
        if deterministic:
            tokens = log_probs.argmax(-1)
        else:
            flat = log_probs.exp().reshape(-1, self.bins.num_bins)
            tokens = torch.multinomial(flat, 1).view(log_probs.shape[:-1])
        taken = log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)[..., : self.env_action_dim]
        per_chunk = taken.reshape(batch, plan_steps // chunk, -1).sum(-1)
        return self.bins.actions(tokens), per_chunk

    def chunk_log_prob(
        self,
        plan_obs: torch.Tensor,
        horizons: torch.Tensor,
        offsets: torch.Tensor,
        chunk_actions: torch.Tensor,
        plan_latent: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-prob and entropy, over the env's dims, of the chunk of actions that
        started at ``offsets`` in the plan made from ``plan_obs``."""
        log_probs, entropy = self.token_log_probs(
            plan_obs, horizons, offsets, chunk_actions, plan_latent
        )
        return log_probs.sum((1, 2)), entropy.sum((1, 2))

    def token_log_probs(
        self,
        plan_obs: torch.Tensor,
        horizons: torch.Tensor,
        offsets: torch.Tensor,
        chunk_actions: torch.Tensor,
        plan_latent: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``chunk_log_prob`` per action token ``[B, chunk, env dims]``, with each
        token's entropy over its bins: what a per-token ratio clips."""
        del plan_latent  # a plan of this policy says all its log-prob needs
        chunk = chunk_actions.shape[1]
        log_probs = self._tempered(self.plan_logits(plan_obs, horizons)).log_softmax(-1)
        if chunk < self.max_horizon:
            steps = offsets.long().unsqueeze(1) + torch.arange(chunk, device=offsets.device)
            index = steps[:, :, None, None].expand(-1, -1, *log_probs.shape[2:])
            log_probs = log_probs.gather(1, index)
        dims = self.env_action_dim
        log_probs = log_probs[:, :, :dims]
        tokens = self.bins.tokens(chunk_actions[..., :dims])
        taken = log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        return taken, entropy

    def _tempered(self, logits: torch.Tensor) -> torch.Tensor:
        return logits if self.temperature == 1.0 else logits / self.temperature

    def step_log_probs(
        self, obs: torch.Tensor, horizons: torch.Tensor, plans: torch.Tensor
    ) -> torch.Tensor:
        """``[B, max_horizon]``: the log-prob of each step of whole plans ``plans [B,
        max_horizon, action_dim]`` over the env's dims (behaviour cloning's targets)."""
        dims = self.env_action_dim
        log_probs = self.plan_logits(obs, horizons).log_softmax(-1)[:, :, :dims]
        tokens = self.bins.tokens(plans[..., :dims])
        return log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).sum(-1)


def attention_pattern(prompt_mask: torch.Tensor, queries: int) -> torch.Tensor:
    """Who attends to whom in ``[prompt, queries]``: ``[B, 1, L, L]`` bools, True where
    the token of a row (query side) may read the token of a column (key side).
    ``prompt_mask [B, P]`` marks the prompt's real tokens (it is left-padded).

    Padding is read by no one; the prompt's tokens read each other both ways (PaliGemma's
    prefix attention, as pretrained); the queries read the prompt and each other; the
    prompt never reads the queries (OpenVLA-OFT's layout), so the prompt's states are
    the same whatever is asked of it. Every row reads at least the prompt's real
    tokens, so no softmax is over nothing."""
    batch, prompt = prompt_mask.shape
    length = prompt + queries
    real = torch.cat(
        [prompt_mask.bool(), prompt_mask.new_ones(batch, queries, dtype=torch.bool)], 1
    )
    is_query = torch.arange(length, device=prompt_mask.device) >= prompt
    readable = ~is_query[None, :] | is_query[:, None]  # [L, L]: prompt keys, or query reads query
    return (real[:, None, :] & readable[None]).unsqueeze(1)


def resize_mode(image_processor: Any) -> str:
    """The torch interpolation mode of the processor's own resize (``resample``)."""
    resample = getattr(image_processor, "resample", 2)
    key = getattr(resample, "value", resample)  # PIL's IntEnum, torchvision's mode enum
    try:
        return RESAMPLE_MODES[int(key) if not isinstance(key, str) else key.lower()]
    except (KeyError, ValueError):
        raise ValueError(
            f"the processor resizes with resample={resample!r}; the policy does bicubic, "
            "bilinear and nearest as the processor would"
        ) from None


def _prompt_table(processor: Any, spec: VisionLanguageSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Each task's prompt as the processor builds it (image tokens, then the
    instruction), left-padded to one length: ``[num_tasks, L]`` ids and mask. Built once;
    a rollout indexes it by task id."""
    import numpy as np

    blank = np.zeros((*spec.image_shape[1:], spec.image_shape[0]), dtype=np.uint8)
    images = [[blank] * spec.num_images for _ in spec.instructions]
    processor.tokenizer.padding_side = "left"
    marks = processor.image_token * spec.num_images  # where the images go: first
    prompts = processor(
        text=[marks + sentence for sentence in spec.instructions],
        images=images,
        padding="longest",
        return_tensors="pt",
    )
    return prompts["input_ids"], prompts["attention_mask"]
