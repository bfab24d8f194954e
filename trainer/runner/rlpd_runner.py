"""RLPD's runs (seed 004): the env copies act with the latest actor, every transition
goes into the online buffer (and a human's into the demo buffer too), and the learner
updates on 50/50 batches as the copies step (the algorithm and its data:
trainer.algorithms.rlpd_algorithm). The copies step in this process, or in
placed env workers that stream their transitions here and act with the weights this
learner publishes (trainer.runtime.rlpd_split); the rest is the same code.

An iteration runs every copy through one episode of the iteration's task (tasks in
turn, init states by the circular cursors of seed 001), so per-task success is counted
like the on-policy runs' and charted the same way (`counts/task{T}/...`). Before
`training_starts` online transitions the copies act uniformly at random.

Where the copies step is a collector: `LocalEpisodes` here, `RLPDActors` for placed
workers. The loop around an iteration (logging, checkpoints, resuming, stopping) is
trainer.runner.loop's. Checkpoints hold the learner, the cursors and the random
generators; both buffers are saved beside them (`buffers/`) every
`buffer_snapshot_every` iterations and restored on resume.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch

from trainer.algorithms.metrics import rates_from_counts
from trainer.algorithms.rlpd import EncoderLayoutError, RLPDSettings
from trainer.algorithms.rlpd_algorithm import RLPDAlgorithm
from trainer.config.errors import ConfigError
from trainer.config.schema import ExperimentConfig
from trainer.data.demos import DemoFileError, load_demos
from trainer.data.intervention_record import INTERVENTIONS_DIR
from trainer.data.replay import compact_images
from trainer.data.samplers import InitStateSampler, TaskCursor
from trainer.devices import device_metrics, gpu_rng_state, load_gpu_rng_state
from trainer.envs.libero_setup import LiberoNotInstalledError
from trainer.envs.registry import UnknownEnvError, make_vector_env
from trainer.envs.vector_env import EnvWorkerError, VectorEnv
from trainer.link.environment import Link
from trainer.runner.build import compute_device, env_options
from trainer.runner.checkpoints import (
    checkpoint_path,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from trainer.runner.interventions import RobotSlice, close_env, with_interventions
from trainer.runner.loop import (
    CheckpointCallback,
    EpisodesCallback,
    MetricsCallback,
    RecoveryCallback,
    TrainingLoop,
)
from trainer.runner.rlpd_episodes import EpisodeStats, run_episodes
from trainer.videos.capture import RoundCapture
from trainer.videos.run_videos import RunVideos

log = logging.getLogger(__name__)


def rlpd_settings(config: ExperimentConfig) -> RLPDSettings:
    r = config.algorithm.rlpd
    return RLPDSettings(
        discount=r.discount, tau=r.tau, critic_ensemble=r.critic_ensemble,
        critic_subsample=r.critic_subsample, layer_norm=r.layer_norm,
        hidden_sizes=tuple(r.hidden_sizes), actor_lr=r.actor_lr, critic_lr=r.critic_lr,
        temperature_lr=r.temperature_lr, init_temperature=r.init_temperature,
        target_entropy=r.target_entropy, cta_ratio=r.cta_ratio,
        backup_entropy=r.backup_entropy, cuda_graph=r.cuda_graph,
        shared_encoder=r.shared_encoder, image_augmentation=r.image_augmentation,
    )  # fmt: skip


def build_env(
    config: ExperimentConfig, link: Link | None = None, robots: RobotSlice | None = None
) -> VectorEnv:
    """The run's env copies, wrapped for interventions when a source is configured.
    With the console as the source, each copy is a simulated robot that operators take
    over through `link` (the env's `console` attribute is the bridge to close);
    `robots`: which of the run's robots they are, in a placed process."""
    try:
        env = make_vector_env(
            config.env.name, num_envs=config.env.num_parallel_envs,
            num_workers=config.env.num_workers, **env_options(config),
        )  # fmt: skip
    except (UnknownEnvError, LiberoNotInstalledError) as error:
        raise ConfigError.single("env.name", str(error)) from None
    except ValueError as error:
        raise ConfigError.single("env", str(error)) from None
    return with_interventions(env, config, link, robots)


class Collector(Protocol):
    """Where RLPD's env copies step: what their envs are, and one episode of every copy
    whose transitions reach `algorithm.take_step` as they are made."""

    obs_shape: tuple[int, ...]
    action_dim: int
    num_envs: int
    num_tasks: int
    # Whether the copies step while the learner updates (placed workers) or in turns.
    steps_while_updating: bool

    def init_state_count(self, task_id: int) -> int: ...

    def collect(
        self, task_id: int, indices: torch.Tensor, algorithm: RLPDAlgorithm,
        capture: RoundCapture | None = None,
    ) -> EpisodeStats:  # fmt: skip
        """`capture`: what to record of the episodes for videos (only copies in this
        process are recorded: placed workers are given None)."""

    def close(self) -> None: ...


class LocalEpisodes:
    """The copies in this process, acting with the learner's actor as it updates. When
    the env's workers (or a real arm's link) fail, they are restarted (reached again)
    and the episodes run again from their init states, at most `retries` times, each
    reported; the transitions stored before the failure stay (they happened)."""

    steps_while_updating = False

    def __init__(
        self, env: VectorEnv, retries: int = 0, on_recovery: Callable[[str], None] | None = None
    ) -> None:
        self.env, self.retries, self.on_recovery = env, retries, on_recovery
        self.obs_shape, self.action_dim = tuple(env.obs_shape), env.action_dim
        self.num_envs, self.num_tasks = env.num_envs, env.num_tasks

    def init_state_count(self, task_id: int) -> int:
        return int(self.env.init_states(task_id).shape[0])

    def collect(
        self, task_id: int, indices: torch.Tensor, algorithm: RLPDAlgorithm,
        capture: RoundCapture | None = None,
    ) -> EpisodeStats:  # fmt: skip
        return self.episodes(task_id, indices, algorithm.act, algorithm.take_step, capture)

    def episodes(
        self, task_id: int, indices: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor],
        take_step: Callable[[dict[str, torch.Tensor]], None],
        capture: RoundCapture | None = None,
    ) -> EpisodeStats:  # fmt: skip
        """One episode of the copies from `indices`' init states, acting with `act`,
        each step's transitions to `take_step` (a placed worker's own loop uses this);
        `capture` records a few of them for videos."""
        states = self.env.init_states(task_id)[indices]
        for attempt in range(self.retries + 1):
            try:
                return run_episodes(self.env, task_id, states, act, take_step, capture)
            except EnvWorkerError as error:
                if attempt == self.retries:
                    raise EnvWorkerError(
                        f"{error} (given up after {attempt} restart(s))"
                    ) from error
                what = "; ".join(self.env.restart_workers()) or "no worker needed a restart"
                log.warning("%s; %s; redoing the episodes", error, what)
                if self.on_recovery is not None:
                    self.on_recovery(f"{str(error).splitlines()[0]}; {what}")
        raise AssertionError("unreachable")

    def close(self) -> None:
        close_env(self.env)


class RLPDRunner(TrainingLoop):
    def __init__(
        self,
        config: ExperimentConfig,
        output_dir: Path | None = None,
        on_metrics: MetricsCallback | None = None,
        on_checkpoint: CheckpointCallback | None = None,
        actors: Collector | None = None,
        link: Link | None = None,
        on_recovery: RecoveryCallback | None = None,
        on_episodes: EpisodesCallback | None = None,
        on_video: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        """`actors`: the run's env copies elsewhere, e.g. in placed workers that act with
        the weights this learner publishes (trainer.runtime.rlpd_split.RLPDActors);
        None: in this process. `link`: the run's link, which the operator console's
        commands arrive by. `on_video`: told each recorded episode's record."""
        super().__init__(
            config, output_dir, on_metrics=on_metrics, on_checkpoint=on_checkpoint,
            on_episodes=on_episodes,
        )  # fmt: skip
        # The env of this process's copies (None when they are placed).
        self.env = build_env(config, link) if actors is None else None
        self.videos: RunVideos | None = None  # set once the run is built (close reads it)
        if actors is None:

            def recovered(what: str) -> None:
                if on_recovery is not None:
                    on_recovery(self.iteration + 1, what)

            retries = config.runner.env_worker_retries
            self.collector: Collector = LocalEpisodes(self.env, retries, recovered)
        else:
            self.collector = actors
        envs = self.collector
        self.obs_shape, self.action_dim = tuple(envs.obs_shape), envs.action_dim
        self.num_envs, self.num_tasks = envs.num_envs, envs.num_tasks
        try:  # a config the env refuses must not leave its worker processes behind
            task_ids = self._task_ids()
            self.algorithm = RLPDAlgorithm(
                self.obs_shape, self.action_dim, rlpd_settings(config), config.algorithm.rlpd,
                self.num_envs, self.generator, compute_device(config), config.actor.precision,
            )  # fmt: skip
            self.demos_loaded = self._load_demos()
        except BaseException:
            self.close()
            raise
        self.task_cursor = TaskCursor(task_ids)
        self.init_states = InitStateSampler(
            {task: envs.init_state_count(task) for task in task_ids}
        )
        self.buffer_dir = self.output_dir / "buffers"
        # Episode videos of the copies in this process (placed workers record none yet).
        if self.env is not None:
            self.videos = RunVideos.of(config.runner.videos, self.env, self.output_dir, on_video)

    def _task_ids(self) -> list[int]:
        config = self.config
        if len(self.obs_shape) not in (1, 3):
            raise ConfigError.single(
                "env", f"rlpd takes state vectors or [C, H, W] images, not {self.obs_shape}"
            )
        task_ids = list(config.env.task_ids or range(self.num_tasks))
        bad = [t for t in task_ids if not 0 <= t < self.num_tasks]
        if bad:
            known = f"0..{self.num_tasks - 1}"
            raise ConfigError.single(
                "env.task_ids", f"{config.env.name} has tasks {known}, not {bad}"
            )
        return task_ids

    def _load_demos(self) -> int:
        """Transitions loaded from `algorithm.rlpd.demos` into the demo buffer."""
        path = self.config.algorithm.rlpd.demos
        if not path:
            return 0
        try:
            # A dataset's pictures pack into the env's rows as its copies pack theirs.
            vision_language = self.env.vision_language if self.env is not None else None
            demos = load_demos(path, vision_language)
        except DemoFileError as error:
            raise ConfigError.single("algorithm.rlpd.demos", str(error)) from None
        shapes = {"obs": self.obs_shape, "action": (self.action_dim,)}
        for name, shape in shapes.items():
            if tuple(demos[name].shape[1:]) != shape:
                raise ConfigError.single(
                    "algorithm.rlpd.demos",
                    f"{path}: {name} rows have shape {tuple(demos[name].shape[1:])}, the "
                    f"env's are {shape}",
                )
        for name in ("obs", "next_obs"):
            demos[name] = compact_images(demos[name])
        self.algorithm.demo.add(demos)
        return int(demos["obs"].shape[0])

    # ----- one iteration -----------------------------------------------------------
    def train_iteration(self) -> dict[str, float]:
        task_id = self.task_cursor.current()
        indices = self.init_states.take(task_id, self.num_envs)
        algorithm = self.algorithm
        algorithm.start_iteration(task_id)
        started = time.monotonic()
        capture = self._round_capture(task_id, indices)
        stats = self.collector.collect(task_id, indices, algorithm, capture)
        if capture is not None:
            self.videos.finish(capture)
        elapsed = time.monotonic() - started
        update_metrics, update_seconds = algorithm.update_metrics, algorithm.update_seconds
        stepping_aside = 0.0 if self.collector.steps_while_updating else update_seconds
        copies, success = self.num_envs, stats.success
        env_steps = int(stats.lengths.sum())
        self.total_env_steps += env_steps
        self.iteration += 1
        self.task_cursor.advance()
        counts: Counter[str] = Counter(
            episodes=float(copies), successes=float(success.sum()),
            return_sum=float(stats.returns.sum()), length_sum=float(stats.lengths.sum()),
        )  # fmt: skip
        counts[f"task{task_id}_success_count"] = float(success.sum())
        counts[f"task{task_id}_total_count"] = float(copies)
        metrics = rates_from_counts(counts)
        metrics.update(algorithm.update_means())
        metrics.update(device_metrics(algorithm.device))
        # Critic updates per transition stored this iteration: RLPD's update-to-data ratio.
        metrics["rlpd/utd"] = (
            len(update_metrics) * self.config.algorithm.rlpd.cta_ratio / max(env_steps, 1)
        )
        metrics["rlpd/demo_share"] = algorithm.sampler.demo_share
        intervened = stats.intervened_steps > 0
        if self.config.env.interventions.source != "none":  # one episode per copy
            shares = stats.intervened_steps / stats.lengths.clamp(min=1)
            self.episode_rates = [float(share) for share in shares.tolist()]
        unassisted = ~intervened & (stats.held_steps == 0)
        if bool(unassisted.any()):  # what the policy achieved on its own
            metrics["rollout/unassisted_success_rate"] = float(success[unassisted].float().mean())
        if stats.policy_lag is not None:
            metrics["rlpd/policy_lag"] = stats.policy_lag
        metrics.update(
            {
                "rollout/task_id": float(task_id),
                "interventions/episodes": float(intervened.sum()),
                "interventions/steps": float(stats.intervened_steps.sum()),
                "interventions/rate": float(stats.intervened_steps.sum()) / max(env_steps, 1),
                "interventions/held_steps": float(stats.held_steps.sum()),
                "buffers/online": float(len(algorithm.online)),
                "buffers/demo": float(len(algorithm.demo)),
                "rlpd/updates": float(algorithm.learner.updates),
                "charts/update_rate": len(update_metrics)
                * self.config.algorithm.rlpd.cta_ratio
                / max(update_seconds, 1e-9),
                # Placed workers step while the learner updates; in one process they alternate.
                "charts/SPS": env_steps / max(elapsed - stepping_aside, 1e-9),
                "charts/env_steps": float(self.total_env_steps),
                "charts/iteration_seconds": elapsed,
            }
        )
        return metrics

    def _round_capture(self, task_id: int, indices: list[int]) -> RoundCapture | None:
        """What of this iteration's episodes to record (copies in this process only)."""
        if self.videos is None:
            return None
        self.videos.new_iteration()
        iteration = self.iteration + 1

        def name(copy: int) -> str:
            return f"i{iteration:06d}-t{task_id}-c{copy}"

        return self.videos.capture(
            iteration, task_id, self.env.task_name(task_id), [int(i) for i in indices], None,
            self.num_envs, name,
        )  # fmt: skip

    def close(self) -> None:
        self.collector.close()
        if self.videos is not None:
            self.videos.close()

    def summary(self, metrics: dict[str, float]) -> str:
        return (
            f"success {metrics.get('rollout/success_rate', 0.0):.2f} "
            f"Q {metrics.get('rlpd/q_predicted', 0.0):.2f} "
            f"demo {metrics.get('buffers/demo', 0.0):.0f}"
        )

    # ----- checkpoints -------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "iteration": self.iteration,
            "learner": self.algorithm.learner.state_dict(),
            "total_env_steps": self.total_env_steps,
            # What the stored transitions paid for beyond whole rounds: a resumed run
            # makes its next round when the uninterrupted one would.
            "owed_updates": self.algorithm.owed_updates,
            "task_cursor": self.task_cursor.position,
            "init_states": self.init_states.state_dict(),
            "torch_rng": torch.get_rng_state(),
            **gpu_rng_state(self.algorithm.device),
            "sampling_rng": self.generator.get_state(),
            **self._gpu_batch_rng(),
            "config": self.config.model_dump(mode="json"),
        }

    def _gpu_batch_rng(self) -> dict[str, Any]:
        """The generator of the GPU's batches, where the buffers are on one."""
        generator = self.algorithm.batch_generator
        return {} if generator is self.generator else {"batch_rng": generator.get_state()}

    def save_beside(self, final: bool) -> None:
        """Both buffers, at the end, at a stop, and every `buffer_snapshot_every`; with
        them the operators' transitions as a LeRobot dataset."""
        every = self.config.algorithm.rlpd.buffer_snapshot_every
        if not (final or every == 0 or self.iteration % every == 0):
            return
        self._write_interventions()
        path = save_checkpoint(self.buffer_dir, self.iteration, self.algorithm.buffers_state())
        for older in self.buffer_dir.glob("iter_*.pt"):  # one snapshot is enough
            if older != path:
                older.unlink()

    def _write_interventions(self) -> None:
        env, interventions = self.env, self.config.env.interventions
        if env is None:  # placed copies: their env's names and pictures are theirs
            vision_language, task_name = None, (lambda task: f"task {task}")
        else:
            vision_language, task_name = env.vision_language, env.task_name
        console = interventions.source == "console"
        fps = max(1, round(interventions.control_hz)) if console else None
        folder = self.output_dir / INTERVENTIONS_DIR
        record = self.algorithm.interventions
        if record.write(folder, vision_language, task_name, fps):
            log.info("%d intervened transitions written to %s", len(record), folder)

    def load_state(self, state: dict[str, Any], path: Path) -> None:
        self.iteration = state["iteration"]
        try:
            self.algorithm.learner.load_state_dict(state["learner"])
        except EncoderLayoutError as error:
            raise ConfigError.single("algorithm.rlpd.shared_encoder", str(error)) from None
        self.total_env_steps = state["total_env_steps"]
        self.algorithm.owed_updates = state.get("owed_updates", 0.0)  # 0 in older checkpoints
        self.task_cursor.position = state["task_cursor"]
        self.init_states.load_state_dict(state["init_states"])
        torch.set_rng_state(state["torch_rng"])
        load_gpu_rng_state(state, self.algorithm.device)
        self.generator.set_state(state["sampling_rng"])
        batch_rng = state.get("batch_rng")  # a GPU run's: resumed where the buffers are
        if batch_rng is not None and self.algorithm.batch_generator is not self.generator:
            self.algorithm.batch_generator.set_state(batch_rng)
        buffers = latest_checkpoint(self.buffer_dir)
        if buffers is not None:
            self.algorithm.load_buffers(load_checkpoint(buffers))
            if buffers != checkpoint_path(self.buffer_dir, self.iteration):
                log.warning("resumed iteration %d with the buffers of %s", self.iteration, buffers)
