"""RLPD as the training loop drives it (seed 004): the learner and the data it learns
from. Every transition goes into the online buffer (and a human's into the demo buffer
too); each stored transition pays for its share of update rounds, drawn 50/50 from both
buffers (the whole batch from the online buffer while no demo data exists). Where the
transitions come from is the runner's collector (trainer.runner.rlpd_runner)."""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from trainer.algorithms.rlpd import RLPDLearner, RLPDSettings
from trainer.data.intervention_record import InterventionRecord
from trainer.data.replay import MixedSampler, ReplayBuffer, add_transitions
from trainer.devices import to_device_async

log = logging.getLogger(__name__)


def random_actions(count: int, action_dim: int, generator: torch.Generator) -> torch.Tensor:
    """Uniform actions in [-1, 1]: what the copies do before `training_starts`, drawn on
    the CPU where the envs step (`generator` is a CPU generator)."""
    return torch.rand(count, action_dim, generator=generator, device="cpu") * 2 - 1


class RLPDAlgorithm:
    def __init__(
        self,
        obs_shape: tuple[int, ...],
        action_dim: int,
        settings: RLPDSettings,
        rlpd: Any,
        num_envs: int,
        generator: torch.Generator,
        device: torch.device | str = "cpu",
        precision: str = "fp32",
    ) -> None:
        """`rlpd`: the config's `algorithm.rlpd` section; `num_envs`: the env copies one
        step of which pays for `updates_per_step` rounds; `generator` draws the random
        actions of exploration and the batches; `device`: where the learner and both
        buffers are (images stay uint8 there); `precision`: the learner's forward
        passes (fp32, or bf16 under autocast)."""
        self.rlpd, self.num_envs, self.action_dim = rlpd, num_envs, action_dim
        self.generator = generator
        self.device = torch.device(device)
        # Batches are drawn where the buffers are: on a GPU by a generator of its own,
        # seeded from `generator` (saved in checkpoints beside it).
        self.batch_generator = generator
        if self.device.type == "cuda":
            seed = int(torch.randint(2**62, (1,), generator=generator, device="cpu"))
            self.batch_generator = torch.Generator(self.device).manual_seed(seed)
        self.learner = RLPDLearner(obs_shape, action_dim, settings, self.device, precision)
        self.online = ReplayBuffer(rlpd.online_capacity, self.device)
        self.demo = ReplayBuffer(rlpd.demo_capacity, self.device)
        # The operators' transitions as they were made, whatever the demo buffer keeps.
        self.interventions = InterventionRecord()
        self.sampler = MixedSampler(
            self.online, self.demo, rlpd.batch_size, rlpd.demo_fraction, rlpd.training_starts,
            fields=self.learner.fields,
        )  # fmt: skip
        self.owed_updates = 0.0  # update rounds the steps taken so far have paid for
        self._online_only = False  # the last state of the sampler the log was told
        # Each update round's statistics, tensors on the device until the iteration
        # reads them (`update_means`).
        self.update_metrics: list[dict[str, torch.Tensor]] = []
        self.update_seconds = 0.0

    def exploring(self) -> bool:
        """Uniformly random actions until `training_starts` online transitions."""
        return len(self.online) < self.rlpd.training_starts

    def act(self, obs: torch.Tensor) -> torch.Tensor:
        """Actions (on the CPU) for copies stepping in this process: random while
        exploring, else the actor's."""
        if self.exploring():
            return random_actions(obs.shape[0], self.action_dim, self.generator)
        return self.learner.actor.act(to_device_async(obs, self.device)).cpu()

    def update_means(self) -> dict[str, float]:
        """This iteration's update statistics averaged, read from the device at once."""
        rows = self.update_metrics
        keys = sorted(set().union(*rows)) if rows else []
        means = [
            torch.stack([row[key] for row in rows if key in row]).float().mean() for key in keys
        ]
        return dict(zip(keys, torch.stack(means).tolist(), strict=True)) if keys else {}

    def start_iteration(self, task_id: int) -> None:
        self.update_metrics, self.update_seconds = [], 0.0
        self.interventions.task_id = task_id

    def take_step(self, rows: dict[str, torch.Tensor]) -> None:
        """One env step's transitions (of the copies still in their episode) into the
        buffers, then the update rounds they pay for: `updates_per_step` rounds per
        `num_envs` stored transitions, so the update-to-data ratio is per transition, as
        RLPD defines it, however many copies are still stepping."""
        add_transitions(self.online, self.demo, rows)
        self.interventions.add(rows)
        if not self.sampler.ready():
            self.owed_updates = 0.0
            return
        self._note_demo_share()
        stored = int(rows["reward"].shape[0])
        self.owed_updates += self.rlpd.updates_per_step * stored / self.num_envs
        started = time.monotonic()
        while self.owed_updates > 1 - 1e-9:
            self.update_metrics.append(self.learner.update(self._sample))
            self.owed_updates -= 1
        self.update_seconds += time.monotonic() - started

    def _sample(self) -> dict[str, torch.Tensor]:
        return self.sampler.sample(self.batch_generator)

    def _note_demo_share(self) -> None:
        """Say in the log when updates draw from the online buffer alone for want of
        demo data, and when demo data arrives."""
        online_only = self.sampler.online_only
        if online_only == self._online_only:
            return
        self._online_only = online_only
        if online_only:
            log.warning(
                "rlpd: the demo buffer is empty (no algorithm.rlpd.demos, no intervention "
                "yet): updates draw whole batches from the online buffer until demo data "
                "arrives (rlpd/demo_share 0)"
            )
        else:
            log.info(
                "rlpd: demo data arrived: batches draw %.0f%% from the demo buffer",
                100 * self.sampler.demo_share,
            )

    # ----- checkpoints -------------------------------------------------------------
    def buffers_state(self) -> dict[str, Any]:
        return {
            "online": self.online.state_dict(),
            "demo": self.demo.state_dict(),
            "interventions": self.interventions.state_dict(),
        }

    def load_buffers(self, state: dict[str, Any]) -> None:
        self.online.load_state_dict(state["online"])
        self.demo.load_state_dict(state["demo"])
        if "interventions" in state:  # snapshots from before the record have none
            self.interventions.load_state_dict(state["interventions"])
