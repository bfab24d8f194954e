"""Build the env, models and algorithm a config describes, checking the parts of the
config that only the env can check (task ids, action dims) with key-path errors."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer.algorithms import ALGORITHMS, OnPolicyAlgorithm, OnPolicySettings
from trainer.config.errors import ConfigError, ConfigIssue
from trainer.config.schema import ExperimentConfig
from trainer.data.demos import DemoFileError, load_demos, record_demos, save_demos
from trainer.data.replay import Batch
from trainer.devices import enable_fast_matmul, local_rank, resolve_device
from trainer.envs.intervention import ScriptedReachOperator
from trainer.envs.libero_setup import LiberoNotInstalledError
from trainer.envs.registry import UnknownEnvError, make_vector_env
from trainer.envs.vector_env import VectorEnv
from trainer.envs.vision_language import VisionLanguageSpec
from trainer.link.environment import Link
from trainer.models.critic import ValueCritic
from trainer.models.encoders import build_encoder
from trainer.models.interface import ChunkedPolicy
from trainer.models.policy import GaussianChunkPolicy
from trainer.models.trained_state import load_policy_checkpoint
from trainer.runner.checkpoints import (
    NoCheckpoint,
    UnreadableCheckpoint,
    find_checkpoint,
    load_checkpoint,
)
from trainer.runner.interventions import RobotSlice, with_interventions


@dataclass
class Components:
    env: VectorEnv
    algorithm: OnPolicyAlgorithm
    task_ids: list[int]


def settings_from_config(config: ExperimentConfig) -> OnPolicySettings:
    a = config.algorithm
    return OnPolicySettings(
        gamma=a.gamma,
        gae_lambda=a.gae_lambda,
        clip_ratio=a.clip_ratio,
        clip_ratio_low=a.clip_ratio_low,
        clip_ratio_high=a.clip_ratio_high,
        kl_coef=a.kl_coef,
        value_clip=a.value_clip,
        value_loss_coef=a.value_loss_coef,
        entropy_coef=a.entropy_coef,
        target_kl=a.target_kl,
        update_epochs=a.update_epochs,
        num_minibatches=a.num_minibatches,
        learning_rate=config.actor.learning_rate,
        critic_learning_rate=config.critic.learning_rate,
        max_grad_norm=config.actor.max_grad_norm,
        normalize_advantages=a.normalize_advantages,
        group_size=a.group_size,
        use_plan_reward=a.use_plan_reward,
        plan_reward_coef=a.plan_reward_coef,
        base_h=a.base_h,
        bootstrap_timeouts=a.bootstrap_timeouts,
        ratio=a.ratio,
        loss_aggregation=a.loss_aggregation,
        lr_warmup_updates=config.actor.lr_warmup_updates,
        cuda_graph=a.cuda_graph,
        rollout_cuda_graph=config.rollout.cuda_graph,
    )


def _env_problems(config: ExperimentConfig, env: VectorEnv) -> list[ConfigIssue]:
    problems = []
    for index, task_id in enumerate(config.env.task_ids or []):
        if task_id >= env.num_tasks:
            problems.append(
                ConfigIssue(
                    "env.task_ids",
                    f"{config.env.name} has tasks 0..{env.num_tasks - 1}, not {task_id}",
                    ("env", "task_ids", index),
                )
            )
    if config.actor.model.action_dim < env.action_dim:
        problems.append(
            ConfigIssue(
                "actor.model.action_dim",
                f"{config.actor.model.action_dim} is fewer than the env's {env.action_dim} "
                "action dims",
                ("actor", "model", "action_dim"),
            )
        )
    return problems


def env_options(config: ExperimentConfig) -> dict[str, Any]:
    """What `make_vector_env` is given besides the copy count: the same options build a
    run's env in its own process, in worker processes, or in placed env workers."""
    # Keys only some envs take are passed only when set, so the rest never see them.
    only_some: dict[str, Any] = {}
    if config.env.suite is not None:
        only_some["suite"] = config.env.suite
    if config.env.physics_substeps != 1:
        only_some["physics_substeps"] = config.env.physics_substeps
    if config.env.image_size is not None:
        only_some["image_size"] = config.env.image_size
    if config.actor.model.kind == "vla":
        only_some["vision_language"] = True
    if config.env.instructions:
        only_some["instructions"] = dict(config.env.instructions)
    if config.env.name == "real_robot":
        real = config.env.real_robot
        robots = [robot.model_dump() for robot in real.robots]
        only_some.update(task=real.task, robots=robots, reconnect_s=real.reconnect_s)
        if real.success_classifier is not None:
            only_some["success_classifier"] = real.success_classifier.model_dump()
    return {
        "max_episode_steps": config.env.max_episode_steps,
        "init_states_per_task": config.env.init_states_per_task,
        "seed": config.env.seed,
        "camera": config.env.camera,
        **only_some,
    }


def compute_device(config: ExperimentConfig) -> torch.device:
    """Where this process computes (`actor.device`, resolved against the GPUs it sees),
    with TF32 matmuls on a GPU."""
    device = resolve_device(config.actor.device, "actor.device", local_rank())
    enable_fast_matmul(device)
    return device


def copies_per_rank(config: ExperimentConfig) -> int:
    return config.env.num_parallel_envs * config.algorithm.group_size


def build_policy(
    config: ExperimentConfig,
    obs_shape: tuple[int, ...],
    env_action_dim: int,
    vision_language: VisionLanguageSpec | None = None,
) -> ChunkedPolicy:
    """The config's policy for an env's observations and actions (the rank's, or its
    rollout worker's copy); a VLA needs the env's `vision_language` facts."""
    model = config.actor.model
    max_horizon = max(config.rollout.action_horizons_pattern)
    if model.kind == "vla":
        if vision_language is None:
            raise ConfigError.single(
                "actor.model.kind", f"{config.env.name} gives no images and instructions for a vla"
            )
        from trainer.models.vla import ModelFolderError, build_vla_policy

        try:
            return build_vla_policy(model, vision_language, env_action_dim, max_horizon)
        except ModelFolderError as error:
            raise ConfigError.single("actor.model.path", str(error)) from None
    try:
        encoder = build_encoder(model.kind, obs_shape, tuple(model.hidden_sizes), model.activation)
    except ValueError as error:
        raise ConfigError.single("actor.model.kind", str(error)) from None
    return GaussianChunkPolicy(
        encoder,
        action_dim=model.action_dim,
        env_action_dim=env_action_dim,
        max_horizon=max_horizon,
        init_log_std=model.init_log_std,
    )


def build_critic(
    config: ExperimentConfig, policy: ChunkedPolicy, obs_shape: tuple[int, ...]
) -> nn.Module:
    """PPO's critic: an encoder of its own and a head, or for a VLA a value head on the
    policy's backbone (`critic.hidden_sizes` size the head's layers)."""
    model, hidden = config.actor.model, tuple(config.critic.hidden_sizes)
    pi0 = model.kind == "vla" and getattr(policy, "family", None) == "pi0"
    if not config.critic.train_backbone and not pi0:
        raise ConfigError.single(
            "critic.train_backbone",
            "false needs a π0's value head (actor.model.path a pi0 folder): other critics "
            "either have no backbone of the policy's or read it through a learned query",
        )
    if model.kind == "vla":
        from trainer.models.vla.value_head import Pi0ValueHead, VLAValueHead

        if pi0:
            train_backbone = config.critic.train_backbone
            return Pi0ValueHead(policy, hidden, train_backbone)  # type: ignore[arg-type]
        return VLAValueHead(policy, hidden)  # type: ignore[arg-type]
    encoder = build_encoder(model.kind, obs_shape, hidden, model.activation)
    return ValueCritic(encoder, max_horizon=policy.max_horizon)


def build_components(
    config: ExperimentConfig,
    generator: torch.Generator,
    env: VectorEnv | None = None,
    link: Link | None = None,
    robots: RobotSlice | None = None,
) -> Components:
    """The run's env (unless given one, e.g. placed env workers; wrapped for the
    configured interventions, whose console takes commands over `link`), policy, critic
    and algorithm."""
    model = config.actor.model
    algorithm_config = config.algorithm
    device = compute_device(config)  # before any env worker starts
    if env is None:
        try:
            env = make_vector_env(
                config.env.name,
                num_envs=copies_per_rank(config),
                num_workers=config.env.num_workers,
                **env_options(config),
            )
        except (UnknownEnvError, LiberoNotInstalledError) as error:
            raise ConfigError.single("env.name", str(error)) from None
        except ValueError as error:
            raise ConfigError.single("env", str(error)) from None
        env = with_interventions(env, config, link, robots)
    problems = _env_problems(config, env)
    if problems:
        raise ConfigError(problems)
    policy = build_policy(config, env.obs_shape, env.action_dim, env.vision_language)
    critic = build_critic(config, policy, env.obs_shape) if algorithm_config.name == "ppo" else None
    algorithm = ALGORITHMS[algorithm_config.name](
        policy,
        critic,
        settings_from_config(config),
        chunk=model.num_action_chunks,
        generator=generator,
        device=device,
        precision=config.actor.precision,
    )
    task_ids = list(config.env.task_ids) if config.env.task_ids else list(range(env.num_tasks))
    demos = None
    if algorithm_config.name == "bc":
        demos = bc_demos(config, env.obs_shape, task_ids, env.vision_language)
        if hasattr(policy, "fit_normaliser"):  # a π0 without statistics for this robot
            _, proprio, _ = env.vision_language.unpack(demos["obs"])  # type: ignore[union-attr]
            policy.fit_normaliser(proprio, demos["action"])
        elif model.kind == "vla" and model.action_bounds == "demos":
            policy.bins.fit_bounds(demos["action"])  # type: ignore[attr-defined]
    if model.init_from:  # after the fit: a checkpoint's bins are those its weights learnt
        start_policy_from(algorithm, Path(model.init_from))
    if demos is not None:
        bc = algorithm_config.bc
        horizons = list(config.rollout.action_horizons_pattern)
        algorithm.set_demos(demos, horizons, bc.batch_size, bc.updates_per_iteration)
    return Components(env=env, algorithm=algorithm, task_ids=task_ids)


def start_policy_from(algorithm: OnPolicyAlgorithm, where: Path) -> None:
    """`actor.model.init_from`: the policy weights of another run's checkpoint."""
    if where.suffix in (".yaml", ".yml"):
        raise ConfigError.single(
            "actor.model.init_from",
            f"{where} is a run config: `python -m trainer run` trains it first; here give "
            "a checkpoint or a run folder",
        )
    try:
        path = find_checkpoint(where)
        saved = load_checkpoint(path).get("algorithm", {})
    except (NoCheckpoint, UnreadableCheckpoint) as error:
        raise ConfigError.single("actor.model.init_from", str(error)) from None
    if "policy" not in saved:
        raise ConfigError.single(
            "actor.model.init_from", f"{path} holds no full policy (a sharded or RLPD checkpoint)"
        )
    try:
        load_policy_checkpoint(algorithm.policy, saved)
    except (RuntimeError, ValueError) as error:
        message = str(error).splitlines()[0]
        raise ConfigError.single(
            "actor.model.init_from", f"{path} does not fit this policy: {message}"
        ) from None
    algorithm.policy_version += 1


def bc_demos(
    config: ExperimentConfig,
    obs_shape: tuple[int, ...],
    task_ids: list[int],
    vision_language: VisionLanguageSpec | None = None,
) -> Batch:
    """The demo file (or LeRobot dataset, whose frames `vision_language` packs into the
    env's rows) bc imitates; on the built-in env, recorded first by the scripted
    operator when `scripted_episodes` asks and the file is not there."""
    bc = config.algorithm.bc
    assert bc.demos is not None  # the config's consistency rules
    path = Path(bc.demos)
    if not path.exists() and bc.scripted_episodes and config.env.name == "builtin_reach":
        copies = min(bc.scripted_episodes, 64)
        env = make_vector_env(config.env.name, num_envs=copies, **env_options(config))
        operator = ScriptedReachOperator(copies, state=env.state_observation)  # type: ignore[attr-defined]
        rounds = -(-bc.scripted_episodes // copies)
        save_demos(path, record_demos(env, operator, task_ids, rounds=rounds), env.vision_language)
    try:
        demos = load_demos(path, vision_language)
    except (DemoFileError, FileNotFoundError) as error:
        raise ConfigError.single("algorithm.bc.demos", str(error)) from None
    if tuple(demos["obs"].shape[1:]) != tuple(obs_shape):
        raise ConfigError.single(
            "algorithm.bc.demos",
            f"{path} holds observations of shape {tuple(demos['obs'].shape[1:])}, the env "
            f"gives {tuple(obs_shape)}",
        )
    return demos
