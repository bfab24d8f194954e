"""Continuous actions as discrete tokens, the way OpenVLA tokenises them: each action
dim's range ``[low, high]`` split into ``num_bins`` equal bins, a token standing for its
bin's centre.

The count is odd (OpenVLA's 255 bins between 256 edges), so a range centred on 0 has a
bin centred on 0: a zero action (an arm held still, a rotation not asked for) decodes to
exactly 0, where 256 bins would give +0.0039 at every step, a constant drift. Centres
are computed from the range's middle outwards for that reason.

The bounds come from the config, or from the demonstrations' 1st and 99th percentiles
(``fit_bounds``, as OpenVLA normalises by its dataset's quantiles). They are buffers of
the policy, so they are saved with its checkpoint and whatever loads it (an evaluation,
an RL run started from a SFT run) decodes its tokens the way it was trained to.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

# OpenVLA's quantiles: the outer 1% of each side is clipped to the end bins.
DEMO_QUANTILE = 0.01


class ActionBins(nn.Module):
    def __init__(self, num_bins: int, low: Sequence[float], high: Sequence[float]) -> None:
        super().__init__()
        if num_bins < 3 or num_bins % 2 == 0:
            raise ValueError(
                f"an action dim needs an odd number of bins (at least 3), so that 0 is a "
                f"bin's centre; got {num_bins}"
            )
        low_t = torch.tensor(list(low), dtype=torch.float32)
        high_t = torch.tensor(list(high), dtype=torch.float32)
        if low_t.shape != high_t.shape or bool((high_t <= low_t).any()):
            raise ValueError(f"each action bound needs low < high, got {list(low)}, {list(high)}")
        self.num_bins = num_bins
        self.register_buffer("low", low_t)
        self.register_buffer("high", high_t)

    def _range(self, dims: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first `dims` dims' middle and bin width (an env may take fewer dims than
        the model predicts)."""
        low, high = self.low[:dims], self.high[:dims]
        return (low + high) / 2, (high - low) / self.num_bins

    def actions(self, tokens: torch.Tensor) -> torch.Tensor:
        """Tokens ``[..., dims]`` -> their bins' centres."""
        middle, width = self._range(tokens.shape[-1])
        return middle + (tokens.float() - (self.num_bins - 1) / 2) * width

    def tokens(self, actions: torch.Tensor) -> torch.Tensor:
        """Actions ``[..., dims]`` -> the bins they fall in (outside the range: the end
        bins). A bin's centre maps back to its own token."""
        middle, width = self._range(actions.shape[-1])
        index = torch.round((actions.float() - middle) / width) + (self.num_bins - 1) / 2
        return index.clamp(0, self.num_bins - 1).long()

    @torch.no_grad()
    def fit_bounds(self, actions: torch.Tensor, quantile: float = DEMO_QUANTILE) -> None:
        """Each dim's range from demonstrated ``actions [N, dims]`` (the first `dims` of
        the model's; the others keep theirs): from the ``quantile`` to the ``1 -
        quantile`` quantile, widened to be symmetric about 0 when it holds 0, so a zero
        action stays exact. A dim the demos never vary keeps its range."""
        values = actions.detach().float().cpu().reshape(-1, actions.shape[-1])
        levels = torch.tensor([quantile, 1 - quantile], device=values.device)
        low, high = torch.quantile(values, levels, dim=0)
        holds_zero = (low <= 0) & (high >= 0)
        reach = torch.maximum(-low, high)
        low = torch.where(holds_zero, -reach, low)
        high = torch.where(holds_zero, reach, high)
        varies = high > low
        dims = values.shape[1]
        self.low[:dims] = torch.where(varies, low, self.low[:dims].cpu()).to(self.low)
        self.high[:dims] = torch.where(varies, high, self.high[:dims].cpu()).to(self.high)
