"""State-value critic ``V(obs, H, offset)`` for PPO and the time-out bootstrap.

A decision's state is more than its observation: with dynamic horizons the policy acts
open-loop on a plan of ``H`` actions, and at ``offset`` into it the next replan is
``H - offset`` actions away. A critic of the observation alone averages the values of
mid-plan and fresh-plan states, and of every horizon, which biases GAE and the time-out
bootstrap; so both critics (this one, and the VLA's value head) take the plan's horizon
and offset too, as the policy takes its horizon.

Checkpoints saved before the plan inputs load with those inputs' weights at zero: the
values the critic had, whatever the plan, from which it learns the plan's part
(`fill_missing_plan_inputs`, `optimizer_state_with_plan_inputs`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from trainer.models.encoders import mlp


def fill_missing_plan_inputs(critic: nn.Module, plan_parameters: tuple[str, ...]) -> None:
    """Let ``critic`` load a state saved before it had ``plan_parameters`` (its plan
    inputs): when all of them are missing, they load as zeros, so the plan adds nothing
    to the saved values. A state that has some of them is loaded as it is (and refused
    by the strict load if it lacks others)."""

    def hook(module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        if any(prefix + name in state_dict for name in plan_parameters):
            return
        own = dict(module.named_parameters())
        for name in plan_parameters:
            state_dict[prefix + name] = torch.zeros_like(own[name].detach())

    critic.register_load_state_dict_pre_hook(hook)


def predates_plan_inputs(critic: nn.Module, critic_state: dict[str, Any]) -> bool:
    """Whether ``critic_state`` was saved before the critic had plan inputs."""
    names = getattr(critic, "plan_parameters", ())
    return bool(names) and not any(name in critic_state for name in names)


def optimizer_state_with_plan_inputs(
    critic: nn.Module, critic_state: dict[str, Any], optimizer_state: dict[str, Any]
) -> dict[str, Any]:
    """``optimizer_state`` made to fit a critic with plan inputs when ``critic_state``
    predates them (else as it is). The plan inputs are the critic's last parameters, and
    the critic's come last in the optimizer (after the policy's), so they are appended to
    the last group with no moments: Adam starts them as any new parameter."""
    if not predates_plan_inputs(critic, critic_state):
        return optimizer_state
    groups = optimizer_state["param_groups"]
    count = len(getattr(critic, "plan_parameters", ()))
    start = 1 + max((index for group in groups for index in group["params"]), default=-1)
    last = {**groups[-1], "params": [*groups[-1]["params"], *range(start, start + count)]}
    return {**optimizer_state, "param_groups": [*groups[:-1], last]}


def split_optimizer_group(
    optimizer_state: dict[str, Any], first: int, second_lr: float
) -> dict[str, Any]:
    """A one-group optimizer state (the policy's parameters, then the critic's) cut into
    the policy's group of its `first` parameters and the critic's, at step size
    `second_lr`; each parameter keeps its moments."""
    (group,) = optimizer_state["param_groups"]
    params = group["params"]
    groups = [{**group, "params": params[:first]}, {**group, "params": params[first:]}]
    groups[1]["lr"] = second_lr
    return {**optimizer_state, "param_groups": groups}


class ValueCritic(nn.Module):
    """``V(obs, H, offset)``: an encoder of the observation, and a head that also reads
    the plan's horizon and offset (each over the max horizon)."""

    # The plan inputs' parameters, registered last (see optimizer_state_with_plan_inputs).
    plan_parameters = ("plan_input.weight",)

    def __init__(
        self, encoder: nn.Module, head_sizes: tuple[int, ...] = (), *, max_horizon: int
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.max_horizon = max_horizon
        self.head = mlp(encoder.feature_dim, head_sizes, 1)
        first = self.head[0]
        assert isinstance(first, nn.Linear)
        # The head's first layer on [features, plan] as two: the features' weights and
        # the plan's, so that a critic saved before the plan inputs keeps its layer and
        # gains only these (at zero when it loads). Drawn as the joint layer's columns.
        self.plan_input = nn.Linear(2, first.out_features, bias=False)
        bound = 1.0 / math.sqrt(encoder.feature_dim + 2)
        nn.init.uniform_(self.plan_input.weight, -bound, bound)
        fill_missing_plan_inputs(self, self.plan_parameters)

    def forward(
        self, obs: torch.Tensor, horizons: torch.Tensor, offsets: torch.Tensor
    ) -> torch.Tensor:
        """``[B, *obs_shape], [B], [B] -> [B]``: the value of each observation at its
        place in a plan of horizon ``horizons`` (``offsets`` actions into it)."""
        features = self.encoder(obs)
        plan = torch.stack([horizons, offsets], dim=1).to(features.dtype) / self.max_horizon
        hidden = self.head[0](features) + self.plan_input(plan)
        return self.head[1:](hidden).squeeze(-1)
