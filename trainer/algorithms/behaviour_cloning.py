"""Behaviour cloning (SFT) of a chunked policy on demonstrations: each update maximises
the log-prob of the plans the demonstrator executed (for a VLA, the token cross-entropy
of its action tokens), through the same runner as RL: the iteration's rollouts measure
the policy as it learns, its metrics, checkpoints and link are any run's.

The plan from a demo row is the actions of that row and the rows that followed it in
its episode (trainer.data.demo_plans); each row draws a horizon of the rollout's pattern
and only that many steps, still inside the episode, count. A flow-matching policy (π0)
trains its own loss instead (`imitation_loss`), on its whole chunk inside the episode,
as it is pretrained: its chunk is made once, whatever horizon executes it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import nn

from trainer.algorithms.on_policy import OnPolicyAlgorithm
from trainer.data.demo_plans import plan_targets
from trainer.data.replay import Batch
from trainer.data.rollout_storage import Trajectories


class BehaviourCloning(OnPolicyAlgorithm):
    name = "bc"
    normalizes_advantages = False

    def set_demos(
        self, demos: Batch, horizons: list[int], batch_size: int, updates_per_iteration: int
    ) -> None:
        # A flow-matching policy's own loss over its whole chunk, else the plan's NLL.
        self.flow_matching = hasattr(self.policy, "imitation_loss")
        length = self.policy.chunk_size if self.flow_matching else self.policy.max_horizon
        plans, valid = plan_targets(demos, length)
        self.demo_obs = demos["obs"].to(self.device)
        self.demo_plans, self.demo_valid = plans.to(self.device), valid.to(self.device)
        self.horizon_choices = torch.tensor(horizons, device=self.device)
        self.batch_size, self.updates_per_iteration = batch_size, updates_per_iteration

    def compute_returns(self, batch: Trajectories) -> Trajectories:
        """The rollouts only measure the policy: nothing is learnt from them."""
        zeros = torch.zeros_like(batch.valid, dtype=torch.float32)
        return replace(batch, advantage=zeros, returns=zeros)

    def update_rows(self, samples: dict[str, torch.Tensor]) -> dict[str, float]:
        del samples
        self.policy_version += 1
        rows = self.demo_obs.shape[0]
        steps = torch.arange(self.policy.max_horizon, device=self.device)
        trained = [p for group in self.optimizer.param_groups for p in group["params"]]
        losses = []
        for _ in range(self.updates_per_iteration):
            # Drawn on the CPU generator, as every shuffle is (the same draws on any device).
            pick = torch.randint(rows, (min(self.batch_size, rows),), generator=self.generator)
            pick = pick.to(self.device)
            draw = torch.randint(
                len(self.horizon_choices), (pick.shape[0],), generator=self.generator
            ).to(self.device)
            horizons = self.horizon_choices[draw]
            with self.autocast():
                loss = self._loss(pick, horizons, steps)
            self.optimizer.zero_grad()
            buckets = self._gradient_buckets()  # several ranks: their mean gradient
            if buckets is not None:
                buckets.arm()
            (loss / self.collective.world_size).backward()
            if buckets is not None:
                buckets.finish()
            nn.utils.clip_grad_norm_(trained, self.settings.max_grad_norm)
            self.step_optimizer()
            losses.append(loss.detach())
        dims = self.policy.env_action_dim
        loss_mean = torch.stack(losses).mean().item()
        metrics: dict[str, Any] = {
            "bc/loss": loss_mean,
            "bc/demo_rows": float(rows),
            "losses/updates": float(self.updates_per_iteration),
        }
        if not self.flow_matching:
            metrics["bc/nll_per_action_dim"] = loss_mean / dims
        return metrics

    def _loss(
        self, pick: torch.Tensor, horizons: torch.Tensor, steps: torch.Tensor
    ) -> torch.Tensor:
        """The demos' loss at rows `pick`: a π0's flow-matching loss, or the plans' mean
        NLL over the steps of each row's horizon."""
        obs, plans, valid = self.demo_obs[pick], self.demo_plans[pick], self.demo_valid[pick]
        if self.flow_matching:
            return self.policy.imitation_loss(obs, plans, valid)
        counted = valid & (steps[None, :] < horizons[:, None])
        log_probs = self.policy.step_log_probs(obs, horizons, plans)
        return -(log_probs * counted).sum() / counted.sum()
