"""Continuous actions as discrete tokens, the way OpenVLA tokenises them: each action
dim's range ``[low, high]`` split into ``num_bins`` equal bins, a token standing for its
bin's centre.

The bounds are buffers of the policy, so they are saved with its checkpoint and a
checkpoint decodes its tokens the way it was trained to.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class ActionBins(nn.Module):
    def __init__(self, num_bins: int, low: Sequence[float], high: Sequence[float]) -> None:
        super().__init__()
        if num_bins < 2:
            raise ValueError(f"an action dim needs at least 2 bins, not {num_bins}")
        low_t = torch.tensor(list(low), dtype=torch.float32)
        high_t = torch.tensor(list(high), dtype=torch.float32)
        if low_t.shape != high_t.shape or bool((high_t <= low_t).any()):
            raise ValueError(f"each action bound needs low < high, got {list(low)}, {list(high)}")
        self.num_bins = num_bins
        self.register_buffer("low", low_t)
        self.register_buffer("high", high_t)

    def _range(self, dims: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first `dims` dims' low bound and bin width (an env may take fewer dims
        than the model predicts)."""
        low = self.low[:dims]
        return low, (self.high[:dims] - low) / self.num_bins

    def actions(self, tokens: torch.Tensor) -> torch.Tensor:
        """Tokens ``[..., dims]`` -> their bins' centres."""
        low, width = self._range(tokens.shape[-1])
        return low + (tokens.float() + 0.5) * width

    def tokens(self, actions: torch.Tensor) -> torch.Tensor:
        """Actions ``[..., dims]`` -> the bins they fall in (outside the range: the end
        bins). A bin's centre maps back to its own token."""
        low, width = self._range(actions.shape[-1])
        index = torch.floor((actions.float() - low) / width)
        return index.clamp(0, self.num_bins - 1).long()
