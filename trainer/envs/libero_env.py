"""LIBERO behind the ``VectorEnv`` interface: five suites, their fixed init states, success
from the env's own goal predicates, the usual step limits after settle steps.

- **Suites and tasks.** ``suite`` is one of libero_spatial, libero_object, libero_goal,
  libero_10 (10 tasks each) or libero_90 (90 tasks), in LIBERO's standard task order;
  ``task_id`` indexes it. Each task has the 50 init states shipped with LIBERO (full
  MuJoCo states, kept in float64 so a reset reproduces them exactly).
- **Episodes.** A reset loads the init state, then runs ``num_settle_steps`` no-op
  actions (arm still, gripper open) so objects dropped into the scene come to rest, as
  LIBERO evaluations do. The step limit counts only the policy's actions after that.
  Success is LIBERO's sparse reward (1.0 when the BDDL goal holds) and ends the episode;
  hitting the limit is a time-out. robosuite's own horizon is switched off
  (``ignore_done``), since it would raise ``ValueError`` one step past it.
- **Observations.** State-only (default; no renderer, ~50 steps/s per copy):
  ``[eef position (3), eef quaternion (4), gripper joints (2), object state padded to
  MAX_OBJECTS x 14, task one-hot]``, a fixed size per suite so one policy can serve all
  its tasks (tasks differ in their number of objects). Camera: the ``agentview`` image
  as ``[3, H, W]`` floats in [0, 1], flipped upright (MuJoCo renders bottom row first);
  ~120 ms per render, so a few steps/s per copy.
- **Resets are soft** (``hard_reset=False``): loading the full init state afterwards
  makes the scene exact, and it saves ~0.6 s of model rebuilding per episode.

Each copy is one robosuite simulator (~1.5 GB RSS) in this process; ``env.num_workers``
spreads copies over processes (``SubprocVectorEnv``). Changing task rebuilds the copies
(~2-3 s each), which is why the runner works on one task per iteration.
"""

from __future__ import annotations

import contextlib
import io
from typing import Any

import numpy as np
import torch

from trainer.config.env_defaults import (
    LIBERO_DEFAULT_SUITE,
    LIBERO_INIT_STATES_PER_TASK,
    LIBERO_SUITE_MAX_STEPS,
)
from trainer.envs.libero_setup import import_libero
from trainer.envs.vector_env import EnvStep, VectorEnv
from trainer.envs.vision_language import VisionLanguageSpec

ACTION_DIM = 7
NUM_INIT_STATES = LIBERO_INIT_STATES_PER_TASK
# The most movable objects in any LIBERO task (libero_10 / libero_90 have 8); each
# contributes position, quaternion and both relative to the effector: 14 floats.
MAX_OBJECTS = 8
OBJECT_STATE_DIM = MAX_OBJECTS * 14
PROPRIO_DIM = 3 + 4 + 2
# Arm still, gripper open (-1): what LIBERO evaluations send while objects settle.
NOOP_ACTION = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0])
CAMERA_NAME = "agentview"
# What a VLA policy sees (pi0 and OpenVLA-OFT on LIBERO alike): the third-person view and
# the wrist camera.
VLA_CAMERAS = ("agentview", "robot0_eye_in_hand")


class LiberoVectorEnv(VectorEnv):
    """``num_envs`` LIBERO simulators of one suite, stepped in this process."""

    def __init__(
        self,
        num_envs: int,
        suite: str = LIBERO_DEFAULT_SUITE,
        max_episode_steps: int | None = None,
        camera: bool = False,
        image_size: int = 128,
        num_settle_steps: int = 10,
        init_states_per_task: int = NUM_INIT_STATES,
        seed: int = 0,
        vision_language: bool = False,
    ) -> None:
        if num_envs < 1:
            raise ValueError("num_envs must be at least 1")

        if suite not in LIBERO_SUITE_MAX_STEPS:
            raise ValueError(
                f"unknown LIBERO suite {suite!r}; use one of {', '.join(LIBERO_SUITE_MAX_STEPS)}"
            )
        if init_states_per_task != NUM_INIT_STATES:
            raise ValueError(
                f"LIBERO ships {NUM_INIT_STATES} fixed init states per task; "
                f"init_states_per_task cannot be {init_states_per_task}"
            )
        # ``seed`` is accepted for a uniform factory signature: LIBERO's init states are
        # fixed files, and with them loaded the simulation involves no randomness.
        del seed
        self._libero = import_libero()
        with contextlib.redirect_stdout(io.StringIO()):  # LIBERO prints its task order
            self._benchmark = self._libero.benchmark.get_benchmark_dict()[suite]()
        self.suite = suite
        self.num_envs = num_envs
        self.num_tasks = int(self._benchmark.get_num_tasks())
        self.action_dim = ACTION_DIM
        self.max_episode_steps = max_episode_steps or LIBERO_SUITE_MAX_STEPS[suite]
        self.camera = camera
        self.image_size = image_size
        self.num_settle_steps = num_settle_steps
        if camera:
            self.obs_shape: tuple[int, ...] = (3, image_size, image_size)
        else:
            self.obs_shape = (PROPRIO_DIM + OBJECT_STATE_DIM + self.num_tasks,)
        if vision_language:  # both cameras, the proprio state and the task's instruction
            self.vision_language = VisionLanguageSpec(
                image_shape=(3, image_size, image_size),
                num_images=len(VLA_CAMERAS),
                proprio_dim=PROPRIO_DIM,
                instructions=tuple(
                    self.language_instruction(task) for task in range(self.num_tasks)
                ),
            )
            self.obs_shape = (self.vision_language.row_size,)
        self._task_names = list(self._benchmark.get_task_names())
        self._init_state_sets: dict[int, torch.Tensor] = {}
        self._copies: list[Any] = []
        self._task_id: int | None = None
        self._start = np.zeros((num_envs, 0))
        self._elapsed = np.zeros(num_envs, dtype=np.int64)
        self._frames: list[dict[str, np.ndarray]] = [{} for _ in range(num_envs)]

    # ----- tasks and init states -------------------------------------------------
    def init_states(self, task_id: int) -> torch.Tensor:
        self._check_task(task_id)
        if task_id not in self._init_state_sets:
            states = np.asarray(self._benchmark.get_task_init_states(task_id), dtype=np.float64)
            self._init_state_sets[task_id] = torch.from_numpy(states)
        return self._init_state_sets[task_id].clone()

    def task_name(self, task_id: int) -> str:
        return self._task_names[task_id]

    def language_instruction(self, task_id: int) -> str:
        """The task's instruction, for language-conditioned (VLA) policies."""
        return str(self._benchmark.get_task(task_id).language)

    def _check_task(self, task_id: int) -> None:
        if not 0 <= task_id < self.num_tasks:
            raise ValueError(f"task_id {task_id} is not in 0..{self.num_tasks - 1}")

    # ----- episodes ----------------------------------------------------------------
    def reset(self, task_id: int, init_states: torch.Tensor) -> torch.Tensor:
        self._check_task(task_id)
        state_dim = self.init_states(task_id).shape[1]
        if tuple(init_states.shape) != (self.num_envs, state_dim):
            raise ValueError(
                f"init_states must have shape ({self.num_envs}, {state_dim}), "
                f"got {tuple(init_states.shape)}"
            )
        if task_id != self._task_id:
            self._build_copies(task_id)
        self._start = init_states.detach().cpu().numpy().astype(np.float64)
        self._elapsed[:] = 0
        return torch.stack([self._observe(self._restart(i), i) for i in range(self.num_envs)])

    def step(self, actions: torch.Tensor) -> EnvStep:
        if self._task_id is None:
            raise RuntimeError("reset() the env before stepping it")
        if actions.dim() == 2:
            actions = actions.unsqueeze(1)
        if actions.shape[0] != self.num_envs or actions.shape[2] != ACTION_DIM:
            raise ValueError(
                f"actions must have shape ({self.num_envs}, chunk, {ACTION_DIM}), "
                f"got {tuple(actions.shape)}"
            )
        chunks = actions.detach().cpu().numpy().astype(np.float64).clip(-1.0, 1.0)
        reward = torch.zeros(self.num_envs)
        terminated = torch.zeros(self.num_envs, dtype=torch.bool)
        truncated = torch.zeros(self.num_envs, dtype=torch.bool)
        executed = torch.zeros(self.num_envs, dtype=torch.long)
        obs, final = [], []
        for i, copy in enumerate(self._copies):
            raw = None
            for action in chunks[i]:
                raw, step_reward, _, _ = copy.step(action)
                self._elapsed[i] += 1
                executed[i] += 1
                reward[i] += float(step_reward)
                if step_reward > 0:  # LIBERO's sparse reward: 1.0 when the goal holds
                    terminated[i] = True
                    break
                if self._elapsed[i] >= self.max_episode_steps:
                    truncated[i] = True
                    break
            assert raw is not None, "a chunk holds at least one action"
            final.append(self._observe(raw, i))
            if terminated[i] or truncated[i]:
                self._elapsed[i] = 0
                obs.append(self._observe(self._restart(i), i))
            else:
                obs.append(final[-1])
        return EnvStep(
            obs=torch.stack(obs),
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            success=terminated.clone(),
            final_observation=torch.stack(final),
            executed_actions=executed,
        )

    def close(self) -> None:
        for copy in self._copies:
            copy.close()  # frees the simulator (and the EGL context in camera mode)
        self._copies = []
        self._task_id = None

    # ----- internals ---------------------------------------------------------------
    def _build_copies(self, task_id: int) -> None:
        self.close()
        bddl_file = self._benchmark.get_task_bddl_file_path(task_id)
        renders = self.camera or self.vision_language is not None
        self._copies = [
            self._libero.control_env(
                bddl_file_name=bddl_file,
                use_camera_obs=renders,
                has_offscreen_renderer=renders,
                camera_names=list(VLA_CAMERAS) if self.vision_language else [CAMERA_NAME],
                camera_heights=self.image_size,
                camera_widths=self.image_size,
                ignore_done=True,
                hard_reset=False,
            )
            for _ in range(self.num_envs)
        ]
        self._task_id = task_id

    def _restart(self, index: int) -> dict[str, np.ndarray]:
        """Load copy ``index``'s init state and let the scene settle."""
        copy = self._copies[index]
        copy.reset()
        raw = copy.set_init_state(self._start[index])
        for _ in range(self.num_settle_steps):
            raw, _, _, _ = copy.step(NOOP_ACTION)
        return raw

    @property
    def camera_names(self) -> list[str]:
        """The cameras the copies render for their observations (camera or VLA mode);
        none in state mode, where nothing is rendered."""
        if self.vision_language is not None:
            return list(VLA_CAMERAS)
        return [CAMERA_NAME] if self.camera else []

    def camera_frames(self, copy: int) -> dict[str, np.ndarray]:
        """Copy `copy`'s latest camera images, upright `[H, W, 3]` uint8: the ones its
        last observation was made from, not rendered again (the operator console's)."""
        return dict(self._frames[copy]) if copy < len(self._frames) else {}

    def _observe(self, raw: dict[str, np.ndarray], copy: int) -> torch.Tensor:
        frames = {name: np.ascontiguousarray(raw[f"{name}_image"][::-1])  # upright
                  for name in self.camera_names}  # fmt: skip
        if frames:
            self._frames[copy] = frames
        if self.vision_language is not None:
            images = np.stack([frames[name] for name in VLA_CAMERAS])
            proprio = np.concatenate(
                [raw["robot0_eef_pos"], raw["robot0_eef_quat"], raw["robot0_gripper_qpos"]]
            )
            return self.vision_language.pack(
                torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2)[None],
                torch.from_numpy(proprio.astype(np.float32))[None],
                torch.tensor([self._task_id or 0]),
            )[0]
        if self.camera:
            image = frames[CAMERA_NAME]
            return torch.from_numpy(image).permute(2, 0, 1).float().div_(255.0)
        objects = np.asarray(raw["object-state"], dtype=np.float32)
        if objects.shape[0] > OBJECT_STATE_DIM:
            raise ValueError(
                f"task {self._task_id} has {objects.shape[0] // 14} objects; the state "
                f"layout holds at most {MAX_OBJECTS}"
            )
        state = np.zeros(self.obs_shape[0], dtype=np.float32)
        state[0:3] = raw["robot0_eef_pos"]
        state[3:7] = raw["robot0_eef_quat"]
        state[7:9] = raw["robot0_gripper_qpos"]
        state[PROPRIO_DIM : PROPRIO_DIM + objects.shape[0]] = objects
        state[PROPRIO_DIM + OBJECT_STATE_DIM + (self._task_id or 0)] = 1.0
        return torch.from_numpy(state)
