"""What the VLA benchmarks of both families share: the bare model they are measured
against, the GPUs' bf16 peaks, and the RESULT line."""

from __future__ import annotations

from pathlib import Path

import torch

from trainer.models.vla.folder import load_folder

BF16_PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0}


def bare_model(folder: Path, lora, device) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The folder's model loaded again through transformers, with the policy's LoRA
    adapters (the same settings), on `device`, and an AdamW over what trains."""
    model, _ = load_folder(folder)
    if lora is not None:
        from peft import LoraConfig as PeftLora
        from peft import inject_adapter_in_model

        adapters = PeftLora(r=lora.rank, lora_alpha=lora.alpha,
                            target_modules=list(lora.target_modules))  # fmt: skip
        model = inject_adapter_in_model(adapters, model)
        for name, parameter in model.named_parameters():
            parameter.requires_grad_("lora_" in name)
    model.to(device)
    trained = [p for p in model.parameters() if p.requires_grad]
    return model, torch.optim.AdamW(trained, lr=1e-4)


def report(name: str, ours: float, bare: float, unit: str, target: float, device: str) -> None:
    print(f"RESULT bench={name} ours={ours:.1f} baseline={bare:.1f} ratio={ours / bare:.2f} "
          f"unit={unit} better=higher target={target} device={device!r}")  # fmt: skip


def training_rows(
    obs, plan, log_prob, horizons, chunk: int, latent=None
) -> dict[str, torch.Tensor]:
    """One rollout's worth of rows as the update takes them: each observation's first
    chunk, the log-prob it was sampled with (and the plan's latent, a π0's chain), an
    advantage of either sign."""
    rows = obs.shape[0]
    advantage = torch.linspace(-1.0, 1.0, rows, device=obs.device)
    zeros, ones = torch.zeros(rows, device=obs.device), torch.ones(rows, device=obs.device)
    made = {
        "obs": obs, "plan_obs": obs, "actions": plan[:, :chunk].contiguous(),
        "chunk_offset": zeros.long(), "plan_horizon": horizons, "log_prob": log_prob,
        "value": zeros, "advantage": advantage, "returns": zeros, "weight": ones,
        "policy_weight": ones,
    }  # fmt: skip
    if latent is not None:
        made["plan_latent"] = latent
    return made
