"""A π0's inputs from an env's packed vision-language rows, and the env's actions from
its chunk.

The rows (`trainer.envs.vision_language`) hold each copy's cameras (LIBERO's agent view
and wrist; the built-in env's rendered view), its proprio state and its task id. The
folder's own `PI0Processor` makes the prefix (its image processing, the image tokens
before the instruction); the state is normalised by the statistics the policy carries
and zero-padded to `max_state_dim`. A chunk comes back un-normalised and cut to the env's
action dims.

The statistics are the processor's when they fit the env's dims (a checkpoint fine-tuned
on that robot), else computed from the demos a π0 is fine-tuned on (`from_demos`); they
travel with the checkpoint (`to_json`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F

from trainer.envs.vision_language import VisionLanguageSpec

EPS = 1e-8  # PI0Processor's


@dataclass(frozen=True)
class Normaliser:
    state_mean: tuple[float, ...]
    state_std: tuple[float, ...]
    action_mean: tuple[float, ...]
    action_std: tuple[float, ...]
    source: str  # "processor", "demos" or "identity": what a model card says

    @classmethod
    def from_processor(cls, processor: Any, state_dims: int, action_dims: int) -> Normaliser:
        """The processor's statistics when they have the env's dims; none (identity)
        otherwise, until demos give some."""
        state = processor.state_mean.tolist(), processor.state_std.tolist()
        action = processor.actions_mean.tolist(), processor.actions_std.tolist()
        if len(state[0]) == state_dims and len(action[0]) == action_dims:
            return cls(*map(tuple, (*state, *action)), source="processor")
        return cls.identity(state_dims, action_dims)

    @classmethod
    def identity(cls, state_dims: int, action_dims: int) -> Normaliser:
        zeros, ones = (0.0,), (1.0,)
        return cls(zeros * state_dims, ones * state_dims, zeros * action_dims,
                   ones * action_dims, source="identity")  # fmt: skip

    @classmethod
    def from_demos(cls, states: torch.Tensor, actions: torch.Tensor) -> Normaliser:
        """Per-dim mean and standard deviation (over the demos, as LeRobot's statistics
        are) of demo states [N, S] and actions [N, A]."""

        def stats(values: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
            values = values.double().flatten(0, -2)
            spread = values.std(0, correction=0).clamp_min(1e-6)
            return tuple(values.mean(0).tolist()), tuple(spread.tolist())

        return cls(*stats(states), *stats(actions), source="demos")

    def state(self, proprio: torch.Tensor) -> torch.Tensor:
        mean = torch.tensor(self.state_mean, dtype=proprio.dtype, device=proprio.device)
        std = torch.tensor(self.state_std, dtype=proprio.dtype, device=proprio.device)
        return (proprio - mean) / (std + EPS)

    def actions(self, chunk: torch.Tensor) -> torch.Tensor:
        """A chunk [..., max_action_dim] as the env's actions [..., action dims]."""
        dims = len(self.action_mean)
        mean = torch.tensor(self.action_mean, dtype=chunk.dtype, device=chunk.device)
        std = torch.tensor(self.action_std, dtype=chunk.dtype, device=chunk.device)
        return chunk[..., :dims] * (std + EPS) + mean

    def normalise_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """The env's actions [..., action dims] as the model's targets (before padding)."""
        mean = torch.tensor(self.action_mean, dtype=actions.dtype, device=actions.device)
        std = torch.tensor(self.action_std, dtype=actions.dtype, device=actions.device)
        return (actions[..., : len(self.action_mean)] - mean) / (std + EPS)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Normaliser:
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


def observation_inputs(
    processor: Any,
    spec: VisionLanguageSpec,
    rows: torch.Tensor,
    normaliser: Normaliser,
    max_state_dim: int,
) -> dict[str, torch.Tensor]:
    """The model's inputs for packed rows [N, row_size]: every camera of a row, its
    task's instruction, its normalised state padded to `max_state_dim`."""
    images, proprio, task_ids = spec.unpack(rows)
    if proprio.shape[-1] > max_state_dim:
        raise ValueError(f"the env's state has {proprio.shape[-1]} dims; the model takes "
                         f"at most {max_state_dim}")  # fmt: skip
    pictures = images.mul(255).round().clamp(0, 255).byte().permute(0, 1, 3, 4, 2).numpy()
    batch = processor(
        images=[list(cameras) for cameras in pictures],
        text=[spec.instructions[int(task)] for task in task_ids],
    )
    inputs = {key: batch[key] for key in ("input_ids", "attention_mask", "pixel_values",
                                          "pixel_attention_mask")}  # fmt: skip
    state = normaliser.state(proprio.float())
    inputs["state"] = F.pad(state, (0, max_state_dim - state.shape[-1]))
    return inputs
