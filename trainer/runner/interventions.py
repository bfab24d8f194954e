"""Who may take over a run's env copies (`env.interventions`), for every runner: the
scripted test operator, or operators in the control plane's console (each copy a
simulated robot, commands arriving over the run's link)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainer.config.errors import ConfigError
from trainer.config.schema import ExperimentConfig, InterventionConfig
from trainer.envs.intervention import InterventionEnv, ScriptedReachOperator
from trainer.envs.teleop import TeleopSettings, TeleopSource
from trainer.envs.vector_env import VectorEnv
from trainer.link.environment import Link, NullLink
from trainer.robots.console_bridge import ConsoleBridge
from trainer.robots.driver import SimulatedRobot


@dataclass(frozen=True)
class RobotSlice:
    """A placed process's share of the run's robots: the run's number of its first
    copy, how many robots the run has, and where its ended takeovers are stored."""

    first: int
    total: int
    audit: Callable[[str, dict[str, Any]], None]


def with_interventions(
    env: VectorEnv, config: ExperimentConfig, link: Link | None, robots: RobotSlice | None = None
) -> VectorEnv:
    """`env` wrapped for the configured source; `env` itself without one. With the
    console, the wrapper's `console` attribute is the bridge (`close_env` closes it);
    `robots`: which of the run's robots these copies are (all, without it)."""
    interventions = config.env.interventions
    if interventions.source == "scripted":
        if config.env.name != "builtin_reach":
            env.close()
            raise ConfigError.single(
                "env.interventions.source", "the scripted operator drives the built-in env only"
            )
        # It steers by the state: where the env observes something else (pictures),
        # it reads the state from the env itself.
        state = getattr(env, "state_observation", None)
        if state is None and (len(env.obs_shape) != 1 or env.vision_language is not None):
            env.close()
            raise ConfigError.single(
                "env.interventions.source",
                "the scripted operator steers by the built-in env's state, which env "
                "worker processes (env.num_workers) do not pass on beside images",
            )
        operator = ScriptedReachOperator(
            env.num_envs, share=interventions.share, max_steps=interventions.max_steps,
            seed=config.runner.seed, state=state,
        )  # fmt: skip
        return InterventionEnv(env, operator)
    if interventions.source == "console":
        return _console_env(env, interventions, link or NullLink(), robots)
    return env


def _console_env(
    env: VectorEnv, settings: InterventionConfig, link: Link, place: RobotSlice | None
) -> InterventionEnv:
    # On its default clock, time.monotonic: the bridge turns the server's stamps into it.
    # Every env the console drives (the built-in env, LIBERO, SERL's arms) takes an
    # end-effector delta and its gripper last.
    source = TeleopSource(
        env.num_envs, env.action_dim,
        TeleopSettings(settings.deadman_s, settings.command_window_s, settings.on_link_loss,
                       settings.control_hz, settings.real_time),
        gripper_dim=env.action_dim - 1,
    )  # fmt: skip
    drivers = getattr(env, "drivers", None)  # real arms (trainer.envs.real_robot)
    if drivers is not None:
        from trainer.envs.real_robot import RobotConsoleView  # requests, scipy: arms only

        robots = [RobotConsoleView(d, c) for d, c in zip(drivers, env.cameras, strict=True)]
    else:
        first = place.first if place is not None else 0
        robots = [SimulatedRobot(env, copy, f"sim-{first + copy}") for copy in range(env.num_envs)]
    wrapped = InterventionEnv(env, source)
    wrapped.console = ConsoleBridge(
        link, source, robots, lambda: wrapped.current_task_name,
        camera_fps=settings.camera_fps, jpeg_quality=settings.camera_quality,
        **({} if place is None else {"first_robot": place.first, "total_robots": place.total,
                                     "audit": place.audit}),
    )  # fmt: skip
    return wrapped


def close_env(env: VectorEnv) -> None:
    """Close the console first (it ends takeovers under way and audits them)."""
    console = getattr(env, "console", None)
    if console is not None:
        console.close()
    env.close()
