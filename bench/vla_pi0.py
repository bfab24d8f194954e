"""Benchmark: the π0 policy's decisions and update against transformers' own π0
(`python bench/vla.py --family pi0`).

- ``pi0_decide``: decisions/s of our `sample_plan` (packed observations -> the folder's
  processor -> prefix once, its KV cache reused by every Flow-SDE step -> the chunk
  un-normalised, its log-probs and chain) against `sample_actions` on inputs processed
  beforehand, with the same number of steps. Target >= 0.9.
- ``pi0_update``: samples/s of our GRPO update (`update_rows`: one epoch of minibatches,
  each recomputing its chains' log-probs from the packed observations, clipped
  surrogate, backward, gradient clip, Adam step) against a bare loop over the same
  denoising chains: processed inputs, the prefix once, each step's velocity with
  gradients, a loss over them, backward, AdamW. Target >= 0.85.
- ``pi0_ppo_update``: samples/s of our PPO update with its critic on the prefix's
  features (`Pi0ValueHead`) taking them from the log-prob pass, against the same update
  with the critic running the prefix again (`shares_prefix` off: what it did before). The
  rows are all at a decision, as three in four of the example's are. Target >= 1.25.

The models are random π0s written by the trainer's tiny-π0 builder at the size asked:
`tiny` (width 64, expert 32, 2 layers, 32-pixel images) or `small` (width 256, expert
128, 4 layers, 64-pixel images; the default, CPU-sized), chunks of 50 actions; or
`real` for a GPU: `PI0Config()`'s defaults (a PaliGemma 3B prefix at 224 pixels, a 300 M
expert), random bf16 weights, nothing downloaded. On CUDA it also prints ``pi0_update_mfu``
(model FLOPs of the update: 6 × the prefix's parameters × its tokens plus 6 × the
expert's × the chunk's tokens for every denoising step, against the GPU's bf16 dense
peak) and the update's peak memory per sample.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from bench.gpu import median_pair
from bench.vla_common import BF16_PEAK_TFLOPS, bare_model, report, training_rows
from trainer.algorithms import GRPO, PPO, OnPolicySettings
from trainer.config.schema import FlowConfig, LoraConfig, ModelConfig
from trainer.devices import autocast
from trainer.envs.builtin_reach import BuiltinReachEnv
from trainer.models.vla import build_vla_policy
from trainer.models.vla.flow_sde import prefix_cache
from trainer.models.vla.pi0 import build_full_size_pi0, build_tiny_pi0
from trainer.models.vla.value_head import Pi0ValueHead

SIZES = {  # width, expert width, layers, image size (None: PI0Config()'s defaults)
    "tiny": (64, 32, 2, 32),
    "small": (256, 128, 4, 64),
    "real": None,
}
HORIZON, CHUNK, MINIBATCHES, STEPS = 5, 5, 2, 4


def run(args: argparse.Namespace, device: torch.device, precision: str) -> int:
    size = SIZES[args.size]
    image = 224 if size is None else size[3]
    env = BuiltinReachEnv(args.batch, vision_language=True, image_size=image)
    spec = env.vision_language
    assert spec is not None
    obs = env.reset(0, env.init_states(0)[: args.batch]).to(device)
    lora = LoraConfig(rank=args.lora, alpha=2.0 * args.lora) if args.lora else None
    with tempfile.TemporaryDirectory() as folder:
        if size is None:
            build_full_size_pi0(Path(folder), spec.instructions)
        else:
            width, expert, layers, _ = size
            build_tiny_pi0(Path(folder), spec.instructions, image_size=image, width=width,
                           expert_width=expert, layers=layers)  # fmt: skip
        model = ModelConfig(kind="vla", path=folder, lora=lora, num_action_chunks=CHUNK,
                            flow=FlowConfig(steps=STEPS))  # fmt: skip
        policy = build_vla_policy(model, spec, env.action_dim, HORIZON)
        settings = OnPolicySettings(update_epochs=1, num_minibatches=MINIBATCHES,
                                    learning_rate=1e-4, group_size=2)  # fmt: skip
        grpo = GRPO(policy, None, settings, chunk=CHUNK, generator=torch.Generator(),
                    device=device, precision=precision)  # fmt: skip
        bare = BarePi0(Path(folder), policy, lora, device, precision)
        horizons = torch.full((args.batch,), HORIZON, device=device)
        with autocast(device, precision):
            plan, log_prob, latent = policy.sample_plan_with_latent(obs, horizons, chunk=CHUNK)
        rows = training_rows(obs, plan, log_prob[:, 0], horizons, CHUNK, latent)
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        expert_size = sum(p.numel() for p in policy.backbone.model.dit.parameters())
        print(f"pi0 {args.size}: {sum(p.numel() for p in policy.parameters()) / 1e6:.2f} M "
              f"parameters ({expert_size / 1e6:.2f} M in the expert), "
              f"{policy.trainable_parameters() / 1e6:.2f} M trained, chunk "
              f"{policy.chunk_size}, {STEPS} denoising steps, batch {args.batch}, {precision}, "
              f"{name}")  # fmt: skip

        def decide() -> None:
            with autocast(device, precision):
                policy.sample_plan(obs, horizons, chunk=CHUNK)

        ours_s, bare_s = median_pair(decide, lambda: bare.decide(obs), device, args.repeats)
        report("pi0_decide", args.batch / ours_s, args.batch / bare_s, "decisions/s", 0.9, name)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        ours_s, bare_s = median_pair(
            lambda: grpo.update_rows(dict(rows)), lambda: bare.update(obs, latent), device,
            args.repeats,
        )  # fmt: skip
        report("pi0_update", args.batch / ours_s, args.batch / bare_s, "samples/s", 0.85, name)
        if device.type == "cuda":
            report_mfu(policy, args.batch, ours_s, name, device)
        ppo = PPO(policy, Pi0ValueHead(policy, (64,)), settings, chunk=CHUNK,
                  generator=torch.Generator(), device=device, precision=precision)  # fmt: skip

        def ppo_update(share: bool) -> None:
            policy.shares_prefix = share
            ppo.update_rows(dict(rows))

        ours_s, bare_s = median_pair(
            lambda: ppo_update(True), lambda: ppo_update(False), device, args.repeats
        )
        report("pi0_ppo_update", args.batch / ours_s, args.batch / bare_s, "samples/s", 1.25, name)
    return 0


def report_mfu(policy, batch: int, seconds: float, name: str, device: torch.device) -> None:
    """The update's model FLOPs per second against the GPU's bf16 peak, and its peak
    memory per sample."""
    model = policy.backbone.model
    prefix = sum(p.numel() for p in model.vlm.parameters())
    expert = sum(p.numel() for p in model.dit.parameters())
    prefix_tokens = policy.processor.image_processor.image_seq_length * policy.spec.num_images
    prefix_tokens += 48  # the instruction's tokens, padded by the processor (max_length)
    flops = 6 * batch * (prefix * prefix_tokens + STEPS * expert * (policy.chunk_size + 1))
    peak = next((v for k, v in BF16_PEAK_TFLOPS.items() if k in name), None)
    memory = torch.cuda.max_memory_allocated(device) / batch / 2**30
    print(f"pi0 update: peak memory {memory:.2f} GiB per sample at batch {batch}")
    if peak:
        rate = flops / seconds / 1e12
        print(
            f"RESULT bench=pi0_update_mfu ours={rate:.1f}TFLOP/s baseline={peak:.0f}TFLOP/s "
            f"ratio={rate / peak:.3f} unit=MFU better=higher target=0.4 device={name!r}"
        )


class BarePi0:
    """The same π0 loaded again (with the same adapters), fed inputs processed once."""

    def __init__(self, folder: Path, policy, lora, device, precision: str) -> None:
        self.model, self.optimizer = bare_model(folder, lora, device)
        self.policy, self.device, self.precision = policy, device, precision
        self._inputs: dict[str, torch.Tensor] | None = None

    def inputs(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        if self._inputs is None:
            self._inputs = self.policy.inputs(obs)
        return self._inputs

    @torch.no_grad()
    def decide(self, obs: torch.Tensor) -> None:
        inputs = self.inputs(obs)
        noise = torch.randn(obs.shape[0], self.policy.chunk_size, self.policy.max_dim,
                            device=obs.device)  # fmt: skip
        with autocast(self.device, self.precision):
            self.model.sample_actions(**inputs, noise=noise, num_steps=STEPS)

    def update(self, obs: torch.Tensor, latent: torch.Tensor) -> None:
        inputs = self.inputs(obs)
        states = self.policy.chain_of(latent)[0].transpose(0, 1)
        for part in torch.chunk(torch.arange(obs.shape[0], device=obs.device), MINIBATCHES):
            batch = {name: tensor[part] for name, tensor in inputs.items()}
            chain = states[part]
            with autocast(self.device, self.precision):
                cache, length = prefix_cache(self.model, batch)
                loss = 0.0
                for step in range(STEPS):
                    time = torch.full((len(part),), 1.0 - step / STEPS, device=obs.device)
                    velocity = self.model(
                        state=batch["state"], noise=chain[:, step], timestep=time,
                        past_key_values=cache, attention_mask=batch["attention_mask"],
                        pixel_attention_mask=batch["pixel_attention_mask"],
                    ).logits  # fmt: skip
                    cache.crop(length)
                    loss = loss + (chain[:, step + 1] - velocity).float().square().mean()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
