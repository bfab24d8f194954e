"""A fast built-in env with LIBERO's shape: 7-d actions, several tasks, fixed init
states per task, sparse success and a time limit.

The scene: an end effector (a point with a gripper) and three coloured markers. Task
``reach_<colour>`` asks to bring the effector within ``success_radius`` of that marker
with the gripper open; ``grasp_<colour>`` asks the same with the gripper closed. The
observation shows the effector, the gripper, where the goal marker and the two
distractor markers are relative to the effector, and the task as a one-hot; one policy
learns all six tasks.

Why it is a useful test bed: a random policy succeeds about 5% of the time (the
markers are far, the step is short, and the gripper state must match the task), yet a
small MLP reaches 90%+ in well under a minute on a CPU, because the right action is a
simple function of the observation (move along the goal vector, set the gripper per
task). The time left is not in the observation, so a time-out is not a terminal state:
exactly the case the time-out bootstrap is for.

Actions: ``[dx, dy, dz, droll, dpitch, dyaw, gripper]`` in ``[-1, 1]`` (clipped). The
three rotation dims have no effect here; they exist so policies keep the 7-d shape of
real arms. ``gripper > 0`` closes the gripper, ``< 0`` opens it, exactly 0 keeps it.

``camera``: each copy is observed as its top-down picture (``render``'s, ``[3, S, S]``
floats in [0, 1], ``image_size`` pixels a side) instead of its state, for learning from
pixels; the scripted operator still steers by the state (``state_observation``).

``physics_substeps``: each action is integrated in that many substeps, contact with the
goal checked after each (an effector that passes through the goal region within one
action stops there, solved). One substep is the default and the cheapest; a few hundred
make a step cost about what a physics simulator's does, which is what benchmarks of
distributed stepping need from an env that has no simulator behind it.
"""

from __future__ import annotations

import torch

from trainer.envs.vector_env import EnvStep, VectorEnv
from trainer.envs.vision_language import VisionLanguageSpec

MARKER_COLOURS = ("red", "green", "blue")
MARKER_RGB = ((220, 50, 50), (50, 190, 70), (60, 90, 230))  # how render() draws them
TASK_NAMES = tuple(f"reach_{c}" for c in MARKER_COLOURS) + tuple(
    f"grasp_{c}" for c in MARKER_COLOURS
)
ACTION_DIM = 7
NUM_MARKERS = len(MARKER_COLOURS)
INIT_STATE_DIM = 3 + 3 * NUM_MARKERS  # effector position, then the three markers
# What a vision-language-action policy is told, one sentence per task.
INSTRUCTIONS = tuple(f"reach the {c} marker with the gripper open" for c in MARKER_COLOURS) + tuple(
    f"grasp the {c} marker with the gripper closed" for c in MARKER_COLOURS
)
PROPRIO_DIM = 4  # effector position and gripper (1 closed)
DEFAULT_IMAGE_SIZE = 64


class BuiltinReachEnv(VectorEnv):
    """``num_envs`` copies of the reach/grasp scene, stepped together in torch."""

    def __init__(
        self,
        num_envs: int,
        max_episode_steps: int = 40,
        init_states_per_task: int = 50,
        seed: int = 0,
        success_radius: float = 0.2,
        step_size: float = 0.1,
        camera: bool = False,
        suite: str | None = None,
        physics_substeps: int = 1,
        vision_language: bool = False,
        image_size: int = DEFAULT_IMAGE_SIZE,
        instructions: dict[int, str] | None = None,
    ) -> None:
        """`instructions`: sentences told to a VLA in place of the built-in ones, by task
        id."""
        if num_envs < 1:
            raise ValueError("num_envs must be at least 1")
        if physics_substeps < 1:
            raise ValueError(f"physics_substeps must be at least 1, not {physics_substeps}")
        if suite is not None:
            raise ValueError(f"the built-in env has no suites (got suite {suite!r})")
        unknown = sorted(set(instructions or {}) - set(range(len(TASK_NAMES))))
        if unknown:
            raise ValueError(
                f"instructions: the built-in env has tasks 0..{len(TASK_NAMES) - 1}, not {unknown}"
            )
        self.num_envs = num_envs
        self.num_tasks = len(TASK_NAMES)
        self.action_dim = ACTION_DIM
        self.max_episode_steps = max_episode_steps
        self.success_radius = success_radius
        self.step_size = step_size
        self.physics_substeps = physics_substeps
        self.obs_shape: tuple[int, ...] = (3 + 1 + 3 * NUM_MARKERS + self.num_tasks,)
        if (camera or vision_language) and image_size < 8:
            raise ValueError(f"image_size must be at least 8 pixels, not {image_size}")
        # Camera: the top-down view `render` draws, [3, S, S] floats in [0, 1] as LIBERO's
        # camera gives (what pixel RLPD learns from); the task shows as the ringed marker.
        # A VLA gets that view with the instruction whatever `camera` says, as on LIBERO.
        self.image_size = image_size if camera and not vision_language else None
        if camera:
            self.obs_shape = (3, image_size, image_size)
        if vision_language:
            self.vision_language = VisionLanguageSpec(
                image_shape=(3, image_size, image_size),
                num_images=1,
                proprio_dim=PROPRIO_DIM,
                instructions=tuple(
                    (instructions or {}).get(task, sentence)
                    for task, sentence in enumerate(INSTRUCTIONS)
                ),
            )
            self.obs_shape = (self.vision_language.row_size,)
        self._init_state_sets = [
            _make_init_states(seed, task_id, init_states_per_task)
            for task_id in range(self.num_tasks)
        ]
        self._task_id = 0
        self._start = torch.zeros(num_envs, INIT_STATE_DIM)
        self._effector = torch.zeros(num_envs, 3)
        self._markers = torch.zeros(num_envs, NUM_MARKERS, 3)
        self._gripper_closed = torch.zeros(num_envs, dtype=torch.bool)
        self._elapsed = torch.zeros(num_envs, dtype=torch.long)

    def init_states(self, task_id: int) -> torch.Tensor:
        return self._init_state_sets[task_id].clone()

    def task_name(self, task_id: int) -> str:
        return TASK_NAMES[task_id]

    def reset(self, task_id: int, init_states: torch.Tensor) -> torch.Tensor:
        if not 0 <= task_id < self.num_tasks:
            raise ValueError(f"task_id {task_id} is not in 0..{self.num_tasks - 1}")
        if init_states.shape != (self.num_envs, INIT_STATE_DIM):
            raise ValueError(
                f"init_states must have shape ({self.num_envs}, {INIT_STATE_DIM}), "
                f"got {tuple(init_states.shape)}"
            )
        self._task_id = task_id
        self._start = init_states.to(torch.float32).clone()
        self._restart(torch.ones(self.num_envs, dtype=torch.bool))
        return self._observe()

    def step(self, actions: torch.Tensor) -> EnvStep:
        if actions.dim() == 2:
            actions = actions.unsqueeze(1)
        if actions.shape[0] != self.num_envs or actions.shape[2] != ACTION_DIM:
            raise ValueError(
                f"actions must have shape ({self.num_envs}, chunk, {ACTION_DIM}), "
                f"got {tuple(actions.shape)}"
            )
        actions = actions.detach().to(torch.float32).clamp(-1.0, 1.0)
        reward = torch.zeros(self.num_envs)
        terminated = torch.zeros(self.num_envs, dtype=torch.bool)
        truncated = torch.zeros(self.num_envs, dtype=torch.bool)
        executed = torch.zeros(self.num_envs, dtype=torch.long)
        target = self._markers[:, self._task_id % NUM_MARKERS]
        wants_closed = self._task_id >= NUM_MARKERS
        for k in range(actions.shape[1]):
            running = ~(terminated | truncated)
            if not running.any():
                break
            grip = actions[:, k, 6]
            # Exactly 0 keeps the gripper as it is (a held robot's zero action, an
            # operator who has not touched it), as SERL's arms and robosuite's do.
            closed = torch.where(grip == 0, self._gripper_closed, grip > 0)
            self._gripper_closed = torch.where(running, closed, self._gripper_closed)
            self._elapsed += running.long()
            executed += running.long()
            solved = self._move(running, actions[:, k, :3], target, wants_closed)
            reward += solved.float()
            terminated |= solved
            truncated |= running & ~solved & (self._elapsed >= self.max_episode_steps)
        done = terminated | truncated
        final_observation = self._observe()
        if done.any():
            self._restart(done)
        return EnvStep(
            obs=self._observe(),
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            success=terminated.clone(),
            final_observation=final_observation,
            executed_actions=executed,
        )

    def copy_state(self, copy: int) -> dict[str, list[float]]:
        """One copy's effector position, gripper (1 closed) and the goal marker's
        position, for the console."""
        goal = self._markers[copy, self._task_id % NUM_MARKERS]
        return {
            "effector": [round(v, 3) for v in self._effector[copy].tolist()],
            "gripper": [float(self._gripper_closed[copy])],
            "goal": [round(v, 3) for v in goal.tolist()],
        }

    def render(self, copy: int, size: int = 96) -> torch.Tensor:
        """A top-down picture of one copy, `[size, size, 3]` uint8 (what the operator
        console shows of a state-only env): x to the right, y up, the scene's [-1, 1]
        square filling the frame; the three markers as discs in their colours (the
        goal ringed in white), the effector as a white disc (filled while the gripper
        is closed, a ring while open); a disc's size grows with its height."""
        if not 0 <= copy < self.num_envs:
            raise ValueError(f"copy {copy} is not in 0..{self.num_envs - 1}")
        return self._frames(torch.tensor([copy]), size)[0]

    def render_copies(self, copies: torch.Tensor, size: int = 96) -> torch.Tensor:
        """`render` for the copies `copies`, `[n, size, size, 3]` uint8 (episode videos)."""
        return self._frames(copies, size)

    def _frames(self, copies: torch.Tensor, size: int) -> torch.Tensor:
        """`render` for several copies at once, `[n, size, size, 3]` uint8: the same
        pictures in one batch of tensor ops (the rollout draws every copy each step)."""
        count = copies.shape[0]
        frame = torch.full((count, size, size, 3), 40, dtype=torch.uint8)
        rows = torch.arange(size).view(1, -1, 1).float()
        cols = torch.arange(size).view(1, 1, -1).float()

        def disc(position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            centre_col = ((position[:, 0] + 1) / 2 * (size - 1)).view(-1, 1, 1)
            centre_row = ((1 - position[:, 1]) / 2 * (size - 1)).view(-1, 1, 1)  # y up
            radius = (size * (0.05 + 0.02 * position[:, 2])).view(-1, 1, 1)
            distance = ((rows - centre_row) ** 2 + (cols - centre_col) ** 2).sqrt()
            return distance, radius

        goal = self._task_id % NUM_MARKERS
        white = torch.tensor((255, 255, 255), dtype=torch.uint8)
        for marker, colour in enumerate(MARKER_RGB):
            distance, radius = disc(self._markers[copies, marker])
            frame[distance <= radius] = torch.tensor(colour, dtype=torch.uint8)
            if marker == goal:
                frame[(distance > radius) & (distance <= radius * 1.3)] = white
        distance, radius = disc(self._effector[copies])
        open_ring = ~self._gripper_closed[copies].view(-1, 1, 1)
        inside = (distance <= radius) & ~(open_ring & (distance < radius * 0.6))
        frame[inside] = torch.tensor((240, 240, 240), dtype=torch.uint8)
        return frame

    def _move(
        self, running: torch.Tensor, direction: torch.Tensor, target: torch.Tensor, closed: bool
    ) -> torch.Tensor:
        """Move the running copies by one action in `physics_substeps` substeps; which
        reached the goal with the gripper as the task wants (they stop there)."""
        move = self.step_size * direction / self.physics_substeps
        gripper_ok = self._gripper_closed == closed
        solved = torch.zeros_like(running)
        for _ in range(self.physics_substeps):
            moving = running & ~solved
            self._effector = torch.where(
                moving[:, None], (self._effector + move).clamp(-1.0, 1.0), self._effector
            )
            near = (self._effector - target).norm(dim=1) < self.success_radius
            solved |= moving & near & gripper_ok
        return solved

    def _restart(self, which: torch.Tensor) -> None:
        start = self._start[which]
        self._effector[which] = start[:, :3]
        self._markers[which] = start[:, 3:].reshape(-1, NUM_MARKERS, 3)
        self._gripper_closed[which] = False
        self._elapsed[which] = 0

    def _observe(self) -> torch.Tensor:
        if self.vision_language is not None:
            spec = self.vision_language
            everyone = torch.arange(self.num_envs)
            images = self._frames(everyone, spec.image_shape[1]).permute(0, 3, 1, 2)
            proprio = torch.cat([self._effector, self._gripper_closed.float()[:, None]], dim=1)
            task_ids = torch.full((self.num_envs,), self._task_id)
            return spec.pack(images[:, None], proprio, task_ids)
        if self.image_size is not None:
            everyone = torch.arange(self.num_envs, device=self._effector.device)
            frames = self._frames(everyone, self.image_size)
            return frames.permute(0, 3, 1, 2).float().div_(255.0)
        return self._state()

    def state_observation(self) -> torch.Tensor:
        """The state observation whatever the env serves (what the scripted operator
        steers by when the policy sees images)."""
        return self._state()

    def _state(self) -> torch.Tensor:
        """``[effector, gripper, goal - effector, other markers - effector, task one-hot]``.

        The goal marker comes first, the way a language instruction names the object
        in LIBERO; the other markers stay in view as distractors.
        """
        goal = self._task_id % NUM_MARKERS
        order = [goal] + [k for k in range(NUM_MARKERS) if k != goal]
        relative = self._markers[:, order] - self._effector[:, None, :]
        task = torch.zeros(self.num_envs, self.num_tasks)
        task[:, self._task_id] = 1.0
        return torch.cat(
            [
                self._effector,
                self._gripper_closed.float()[:, None],
                relative.reshape(self.num_envs, -1),
                task,
            ],
            dim=1,
        )


def _make_init_states(seed: int, task_id: int, count: int) -> torch.Tensor:
    """Fixed init states of one task: the effector near the origin, three markers on
    a ring 120 degrees apart (so they never overlap) at a random radius and height."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + task_id)
    effector = (torch.rand(count, 3, generator=generator) - 0.5) * 0.2
    base_angle = torch.rand(count, 1, generator=generator) * 2 * torch.pi
    angles = base_angle + torch.arange(NUM_MARKERS) * (2 * torch.pi / NUM_MARKERS)
    radius = 0.5 + 0.3 * torch.rand(count, NUM_MARKERS, generator=generator)
    height = (torch.rand(count, NUM_MARKERS, generator=generator) - 0.5) * 0.6
    markers = torch.stack([radius * torch.cos(angles), radius * torch.sin(angles), height], dim=2)
    return torch.cat([effector, markers.reshape(count, -1)], dim=1)
