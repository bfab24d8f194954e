"""Benchmark: the VLA policy's update and decisions against the bare transformers model.

- ``vla_update``: samples/s of our GRPO update of a VLA (`update_rows`: one epoch of
  minibatches, each its policy's forward over packed observations, clipped surrogate,
  backward, gradient clip, Adam step) against the bare model: the same backbone, LoRA
  setting and inputs already processed (ids, mask, pixel values, as long a sequence),
  forward through the `transformers` model, a loss over its logits, backward, AdamW.
  ratio = ours / bare. Target >= 0.85.
- ``vla_decide``: decisions/s of our `sample_plan` (packed observations -> pixel values
  and prompt table -> forward -> sampled action tokens -> actions and log-probs) against
  the bare model's no-grad forward on processed inputs. Target >= 0.9.
- On CUDA also ``vla_update_mfu``: model FLOPs of our update (6 x parameters on the
  forward's path x tokens, backward twice the forward) per second against the GPU's
  bf16 dense peak.

The models are random PaliGemmas written with the trainer's tiny-model builder at the
size asked (`--size`): `small` (width 256, 4 layers) by default, CPU-sized; `1b`
(width 2048, 16 layers, intermediate 8192) for a GPU.

    python bench/vla.py [--family tokens|pi0] [--size small|tiny|1b] [--device cpu|cuda]
        [--batch 32] [--lora 16] [--repeats 5]

`--family pi0` measures the π0 policy instead (bench/vla_pi0.py: `pi0_decide`,
`pi0_update`, on CUDA `pi0_update_mfu`; sizes tiny, small and real).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu import median_pair  # noqa: E402
from bench.vla_common import BF16_PEAK_TFLOPS, bare_model, report, training_rows  # noqa: E402
from trainer.algorithms import GRPO, OnPolicySettings  # noqa: E402
from trainer.config.schema import LoraConfig, ModelConfig  # noqa: E402
from trainer.devices import autocast, enable_fast_matmul  # noqa: E402
from trainer.envs.builtin_reach import BuiltinReachEnv  # noqa: E402
from trainer.models.vla import build_vla_policy  # noqa: E402
from trainer.models.vla.tiny import build_tiny_vla  # noqa: E402

SIZES = {  # width, layers, intermediate, image size
    "tiny": (64, 2, 128, 64),
    "small": (256, 4, 1024, 64),
    "1b": (2048, 16, 8192, 224),
}
HORIZON, CHUNK, MINIBATCHES = 5, 5, 2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=("tokens", "pi0"), default="tokens")
    # tokens: tiny, small, 1b; pi0 (bench/vla_pi0.py): tiny, small, real
    parser.add_argument("--size", choices=(*SIZES, "real"), default="small")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=32, help="observations per update")
    parser.add_argument("--lora", type=int, default=16, help="LoRA rank; 0: full fine-tune")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    device = torch.device(args.device)
    precision = "bf16" if device.type == "cuda" else "fp32"
    enable_fast_matmul(device)
    torch.manual_seed(0)
    if args.family == "pi0":
        from bench import vla_pi0

        if args.size not in vla_pi0.SIZES:
            parser.error(f"--size for pi0: one of {', '.join(vla_pi0.SIZES)}")
        return vla_pi0.run(args, device, precision)
    if args.size not in SIZES:
        parser.error(f"--size for the tokens family: one of {', '.join(SIZES)}")
    width, layers, intermediate, image = SIZES[args.size]
    env = BuiltinReachEnv(args.batch, vision_language=True, image_size=image)
    spec = env.vision_language
    assert spec is not None
    obs = env.reset(0, env.init_states(0)[: args.batch]).to(device)
    lora = LoraConfig(rank=args.lora, alpha=2.0 * args.lora) if args.lora else None
    with tempfile.TemporaryDirectory() as folder:
        build_tiny_vla(Path(folder), spec.instructions, image, width=width, layers=layers,
                       intermediate=intermediate)  # fmt: skip
        model = ModelConfig(kind="vla", path=folder, lora=lora, num_action_chunks=CHUNK)
        policy = build_vla_policy(model, spec, env.action_dim, HORIZON)
        settings = OnPolicySettings(update_epochs=1, num_minibatches=MINIBATCHES,
                                    learning_rate=1e-4, group_size=2)  # fmt: skip
        grpo = GRPO(policy, None, settings, chunk=CHUNK, generator=torch.Generator(),
                    device=device, precision=precision)  # fmt: skip
        bare = Bare(Path(folder), policy, lora, device, precision)
        horizons = torch.full((args.batch,), HORIZON, device=device)
        with autocast(device, precision):
            plan, log_prob = policy.sample_plan(obs, horizons, chunk=CHUNK)
        rows = training_rows(obs, plan, log_prob[:, 0], horizons, CHUNK)
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        seq = bare.input_ids(obs).shape[1]
        print(f"model {args.size}: {sum(p.numel() for p in policy.parameters()) / 1e6:.1f} M "
              f"parameters, {policy.trainable_parameters() / 1e6:.2f} M trained, sequence "
              f"{seq} tokens, batch {args.batch}, {precision}, {name}")  # fmt: skip

        ours_s, bare_s = median_pair(
            lambda: grpo.update_rows(dict(rows)), lambda: bare.update(obs), device, args.repeats
        )
        report("vla_update", args.batch / ours_s, args.batch / bare_s, "samples/s", 0.85, name)
        if device.type == "cuda":
            peak = next((v for k, v in BF16_PEAK_TFLOPS.items() if k in name), None)
            on_path = sum(p.numel() for p in bare.model.parameters())
            flops = 6 * on_path * seq * args.batch / ours_s
            if peak:
                print(f"RESULT bench=vla_update_mfu ours={flops / 1e12:.1f}TFLOP/s "
                      f"baseline={peak:.0f}TFLOP/s ratio={flops / 1e12 / peak:.3f} "
                      f"unit=MFU better=higher target=0.45 device={name!r}")  # fmt: skip

        def decide() -> None:
            with autocast(device, precision):
                policy.sample_plan(obs, horizons, chunk=CHUNK)

        ours_s, bare_s = median_pair(decide, lambda: bare.forward(obs), device, args.repeats)
        report("vla_decide", args.batch / ours_s, args.batch / bare_s, "decisions/s", 0.9, name)
    return 0


class Bare:
    """The same backbone loaded again, with the same adapters, fed processed inputs as
    long as ours (prompt + proprio token + plan queries) through its own forward."""

    def __init__(self, folder: Path, policy, lora, device, precision: str) -> None:
        self.model, self.optimizer = bare_model(folder, lora, device)
        self.policy, self.device, self.precision = policy, device, precision
        self.extra = policy.queries.shape[0] + (policy.proprio_projector is not None)
        self._inputs: dict[str, torch.Tensor] | None = None

    def input_ids(self, obs: torch.Tensor) -> torch.Tensor:
        return self.inputs(obs)["input_ids"]

    def inputs(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        """Processed once, outside the timing: what a bare loop is handed."""
        if self._inputs is None:
            images, _, tasks = self.policy.spec.unpack(obs)
            ids = self.policy.prompt_ids[tasks]
            pad = torch.full((ids.shape[0], self.extra), int(ids[0, -1]), device=ids.device)
            ids = torch.cat([ids, pad], dim=1)
            self._inputs = {
                "input_ids": ids,
                "attention_mask": torch.ones_like(ids),
                "pixel_values": self.policy.pixel_values(images).detach(),
            }
        return self._inputs

    def update(self, obs: torch.Tensor) -> None:
        inputs = self.inputs(obs)
        for part in torch.chunk(torch.arange(obs.shape[0], device=obs.device), MINIBATCHES):
            batch = {name: tensor[part] for name, tensor in inputs.items()}
            with autocast(self.device, self.precision):
                logits = self.model(**batch).logits
            loss = logits[:, -self.extra :].float().log_softmax(-1).mean()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()

    @torch.no_grad()
    def forward(self, obs: torch.Tensor) -> None:
        with autocast(self.device, self.precision):
            self.model(**self.inputs(obs))


if __name__ == "__main__":
    sys.exit(main())
