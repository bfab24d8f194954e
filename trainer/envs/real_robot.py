"""Real arms as an env (`env.name: real_robot`): each copy one arm behind its SERL robot
server (trainer.hardware.serl_franka), stepped at its control rate, all arms at once.

An observation is the arm's state, as HIL-SERL's Franka env gives its policy: the
end-effector pose (xyz + quaternion), its velocity (6), force (3) and torque (3), and
the gripper's position (1): 20 numbers. Actions are HIL-SERL's seven numbers in [-1, 1]
(a translation, a rotation and the gripper), scaled, integrated into the measured pose
and clipped to the arm's safety box by its driver. No simulator knows when the task is
solved: an operator's mark in the console ends an episode as a success (reward 1,
terminal) or a failure (trainer.envs.teleop), and the time limit truncates it; with
`env.real_robot.success_classifier`, a frame of the arm's camera that the learned
classifier judges a success ends it as a mark would. Each
episode starts with the driver's reset (errors cleared, joints homed if configured, the
reset pose, the gripper open).

With `vision_language` (a VLA's run), an observation is a packed vision-language row
(`trainer.envs.vision_language`): every camera of the arm (each arm has the same number,
in its config's order), resized to `image_size` pixels square, the 20 numbers of its
state as proprio, and the task's instruction (`env.instructions`' task 0, else the task's
name). A camera with no frame to give is a lost link, as a silent server is: a policy
must not act on a picture nobody saw.

The arms' cameras (MJPEG or snapshot URLs) are the console's: each copy's
`RobotConsoleView` shows its arm's state and camera frames, and its e-stop reaches the
arm at once, between steps. A server that stops answering is a lost link: the step
raises `EnvWorkerError` naming the arm (the runner's recovery calls
`restart_workers`, which reaches the servers again), and nothing is sent to that arm
meanwhile.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from PIL import Image

from trainer.config.addresses import robot_base_url
from trainer.envs.vector_env import EnvStep, EnvWorkerError, VectorEnv
from trainer.envs.vision_language import VisionLanguageSpec
from trainer.hardware.serl_franka import RobotLinkLost, SafetyBox, SerlFranka, SerlSettings
from trainer.hardware.url_camera import CameraLost, UrlCamera

OBS_DIM = 20
ACTION_DIM = 7
RECONNECT_POLL_S = 0.5
VLA_IMAGE_SIZE = 224  # PaliGemma's, π0's: what a VLA's camera pictures are by default


def arm_settings(robot: dict[str, Any]) -> SerlSettings:
    """A driver's settings from a config's `env.real_robot.robots` entry."""
    box = robot["safety_box"]
    url = robot.get("url") or robot_base_url(robot["robot_ip"], robot["port"])
    return SerlSettings(
        url=url,
        safety_box=SafetyBox(
            tuple(box["xyz_low"]),
            tuple(box["xyz_high"]),
            tuple(box["rpy_low"]),
            tuple(box["rpy_high"]),
        ),  # fmt: skip
        action_scale=tuple(robot["action_scale"]),
        control_hz=robot["control_hz"],
        timeout_s=robot["timeout_s"],
        reset_pose=tuple(robot["reset_pose"]) if robot.get("reset_pose") else None,
        joint_reset=robot["joint_reset"],
        cameras={camera["name"]: camera["url"] for camera in robot.get("cameras") or []},
    )


class RealRobotEnv(VectorEnv):
    num_tasks = 1
    obs_shape = (OBS_DIM,)
    action_dim = ACTION_DIM

    def __init__(
        self,
        num_envs: int,
        robots: Sequence[dict[str, Any]] = (),
        task: str = "the operator's task",
        max_episode_steps: int = 100,
        reconnect_s: float = 60.0,
        camera: bool = False,
        success_classifier: dict[str, Any] | None = None,
        vision_language: bool = False,
        image_size: int | None = None,
        instructions: dict[int, str] | None = None,
        **_unused: Any,  # the options of simulated envs (seed, init states per task)
    ) -> None:
        if len(robots) != num_envs:
            raise ValueError(
                f"env.real_robot.robots lists {len(robots)} arms for {num_envs} env copies "
                "(env.num_parallel_envs x algorithm.group_size): one copy per arm"
            )
        if camera:
            raise ValueError(
                "env.camera: a real robot's observations are its state; its cameras are "
                "shown in the console"
            )
        self.num_envs, self.max_episode_steps, self.task = num_envs, max_episode_steps, task
        self.reconnect_s = reconnect_s
        self.drivers = [
            SerlFranka(robot.get("name") or f"arm-{index}", arm_settings(robot))
            for index, robot in enumerate(robots)
        ]
        self.cameras = [
            [
                UrlCamera(name, url, timeout_s=driver.settings.timeout_s)
                for name, url in driver.settings.cameras.items()
            ]  # fmt: skip
            for driver in self.drivers
        ]
        self.judge = SuccessJudge(success_classifier, self.cameras) if success_classifier else None
        self.vision_language: VisionLanguageSpec | None = None
        if vision_language:
            self.vision_language = self._vision_language_spec(
                image_size or VLA_IMAGE_SIZE, (instructions or {}).get(0, task)
            )
            self.obs_shape = (self.vision_language.row_size,)
        self.pool = ThreadPoolExecutor(max_workers=num_envs, thread_name_prefix="arm")
        self.steps = torch.zeros(num_envs, dtype=torch.long, device="cpu")
        self._each(lambda driver, _: driver.connect())

    # ----- VectorEnv -------------------------------------------------------------------
    def init_states(self, task_id: int) -> torch.Tensor:
        """One: every episode starts from the arm's reset."""
        return torch.zeros(1, 1)

    def task_name(self, task_id: int) -> str:
        return self.task

    def reset(self, task_id: int, init_states: torch.Tensor) -> torch.Tensor:
        self._each(lambda driver, _: driver.reset())
        self.steps.zero_()
        return self._observe()

    def step(self, actions: torch.Tensor) -> EnvStep:
        if actions.dim() == 2:
            actions = actions.unsqueeze(1)
        plans = actions.clamp(-1.0, 1.0).double().numpy()
        chunk = plans.shape[1]
        for index in range(chunk):  # every arm takes its action of the chunk at once
            self._each(lambda driver, copy, index=index: driver.send_action(plans[copy, index]))
        self.steps += chunk
        obs = self._observe()
        success = (
            self.judge.solved() if self.judge is not None
            else torch.zeros(self.num_envs, dtype=torch.bool, device="cpu")
        )  # fmt: skip
        truncated = (self.steps >= self.max_episode_steps) & ~success
        self.steps[truncated | success] = 0  # the runner resets what it runs next
        return EnvStep(
            obs=obs, reward=success.float(), terminated=success, truncated=truncated,
            success=success.clone(),
            executed_actions=torch.full((self.num_envs,), chunk, dtype=torch.long, device="cpu"),
            final_observation=obs,
        )  # fmt: skip

    def restart_workers(self) -> list[str]:
        """Reach every arm whose link was lost again, trying for up to `reconnect_s`
        (a restarted server, a cable plugged back in); an arm still away is an error."""
        lost = [driver for driver in self.drivers if driver.lost is not None]
        deadline = time.monotonic() + self.reconnect_s
        for driver in lost:
            while True:
                try:
                    driver.connect()
                    break
                except RobotLinkLost as error:
                    if time.monotonic() >= deadline:
                        raise EnvWorkerError(
                            f"{error} (away for {self.reconnect_s:.0f} s)"
                        ) from error
                    time.sleep(RECONNECT_POLL_S)
        return [f"{driver.name} reached again" for driver in lost]

    @property
    def camera_names(self) -> list[str]:
        """The names of every arm's cameras (none: the run has no picture to record)."""
        return sorted({camera.name for cameras in self.cameras for camera in cameras})

    def render_copies(self, copies: torch.Tensor, size: int = 96) -> torch.Tensor:
        """Each copy's cameras side by side, each `size` pixels square, `[n, size,
        size × most cameras of an arm, 3]` uint8 (episode videos): what the console
        shows, a stream's latest frame or a snapshot taken now, the copies' arms read
        at once. A camera with no frame to give is black."""
        wide = max(len(cameras) for cameras in self.cameras) or 1
        pictures = np.zeros((copies.shape[0], size, size * wide, 3), dtype=np.uint8)

        def picture(row: int, copy: int) -> None:
            for index, camera in enumerate(self.cameras[copy]):
                try:
                    frame = Image.fromarray(camera.read()).convert("RGB")
                except CameraLost:
                    continue
                shown = np.asarray(frame.resize((size, size), Image.Resampling.BILINEAR))
                pictures[row, :, index * size : (index + 1) * size] = shown

        for future in [self.pool.submit(picture, row, copy)
                       for row, copy in enumerate(copies.tolist())]:  # fmt: skip
            future.result()
        return torch.from_numpy(pictures)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        for driver, cameras in zip(self.drivers, self.cameras, strict=True):
            driver.close()
            for camera in cameras:
                camera.close()

    # ----- helpers ---------------------------------------------------------------------
    def _each(self, call) -> None:
        """`call(driver, copy)` on every arm at once; a lost link is the env's error."""
        futures = [self.pool.submit(call, d, i) for i, d in enumerate(self.drivers)]
        errors = []
        for future in futures:
            try:
                future.result()
            except RobotLinkLost as error:
                errors.append(str(error))
        if errors:
            raise EnvWorkerError("; ".join(errors))

    def _vision_language_spec(self, size: int, instruction: str) -> VisionLanguageSpec:
        counts = {len(cameras) for cameras in self.cameras}
        if counts == {0} or len(counts) > 1:
            listed = ", ".join(
                f"{driver.name}: {len(cameras)}"
                for driver, cameras in zip(self.drivers, self.cameras, strict=True)
            )
            raise ValueError(
                "a vla sees the arms' cameras: every arm needs the same number of them, "
                f"at least one (env.real_robot.robots[].cameras; {listed})"
            )
        return VisionLanguageSpec((3, size, size), counts.pop(), OBS_DIM, (instruction,))

    def _pictures(self) -> torch.Tensor:
        """Every arm's cameras now, read at once: [N, cameras, 3, size, size] uint8."""
        assert self.vision_language is not None
        size = self.vision_language.image_shape[1]

        def arm(copy: int) -> np.ndarray:
            frames = []
            for camera in self.cameras[copy]:
                try:
                    frame = Image.fromarray(camera.read()).convert("RGB")
                except CameraLost as error:
                    raise EnvWorkerError(f"{self.drivers[copy].name}: {error}") from error
                frames.append(np.asarray(frame.resize((size, size), Image.Resampling.BILINEAR)))
            return np.stack(frames)

        pictures = [future.result() for future in
                    [self.pool.submit(arm, copy) for copy in range(self.num_envs)]]  # fmt: skip
        return torch.from_numpy(np.stack(pictures)).permute(0, 1, 4, 2, 3)

    def _observe(self) -> torch.Tensor:
        state = self._state()
        if self.vision_language is None:
            return state
        tasks = torch.zeros(self.num_envs, dtype=torch.long, device="cpu")  # envs are CPU-side
        return self.vision_language.pack(self._pictures(), state, tasks)

    def _state(self) -> torch.Tensor:
        rows = []
        for driver in self.drivers:
            state = driver.state
            parts = [state["pose"], state.get("vel", [0.0] * 6), state.get("force", [0.0] * 3),
                     state.get("torque", [0.0] * 3), [state.get("gripper_pos", 0.0)]]  # fmt: skip
            rows.append(np.concatenate([np.ravel(np.asarray(p, dtype=np.float32)) for p in parts]))
        return torch.from_numpy(np.stack(rows))


class SuccessJudge:
    """`env.real_robot.success_classifier` on each arm's chosen camera: the arms whose
    latest frame it judges a success. An arm whose camera is away is not judged (no
    success from a frame nobody saw); its console shows the camera lost."""

    def __init__(self, settings: dict[str, Any], cameras: Sequence[Sequence[UrlCamera]]) -> None:
        from pathlib import Path

        from trainer.envs.success_classifier import load_classifier

        self.model, saved = load_classifier(Path(settings["path"]))
        self.threshold = settings.get("threshold") or saved
        wanted = settings.get("camera")
        self.cameras = []
        for index, arm in enumerate(cameras):
            named = [camera for camera in arm if wanted is None or camera.name == wanted]
            if not named:
                have = ", ".join(camera.name for camera in arm) or "none"
                raise ValueError(
                    f"env.real_robot.success_classifier: arm {index} has no camera "
                    f"{wanted or 'at all'} (its cameras: {have})"
                )
            self.cameras.append(named[0])

    def solved(self) -> torch.Tensor:
        seen = []
        for camera in self.cameras:
            try:
                seen.append(camera.read())
            except CameraLost:
                seen.append(None)
        judged = [index for index, picture in enumerate(seen) if picture is not None]
        success = torch.zeros(len(self.cameras), dtype=torch.bool, device="cpu")
        if judged:
            probability = self.model.success_probability([seen[i] for i in judged])
            success[judged] = probability >= self.threshold
        return success


class RobotConsoleView:
    """An arm as the operator console sees it (a `RobotDriver`): its state and camera
    frames to show, and an e-stop that reaches the arm at once. Actions reach the arm
    through the env's step (the teleop source decides them), never from here."""

    def __init__(self, driver: SerlFranka, cameras: Sequence[UrlCamera]) -> None:
        self.driver, self.cameras, self.name = driver, list(cameras), driver.name
        self.problems: dict[str, str] = {}  # camera name -> why it shows no frame

    def connect(self) -> None:
        """The env connected the arm."""

    def read_state(self) -> dict[str, list[float]]:
        """The arm's state to 4 decimals (0.1 mm, 1e-4 rad): what a person reads."""
        state = self.driver.read_state()
        return {name: [round(value, 4) for value in values] for name, values in state.items()}

    def camera_names(self) -> list[str]:
        return [camera.name for camera in self.cameras]

    def read_cameras(self, names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        frames = {}
        for camera in self.cameras:
            if names is not None and camera.name not in names:
                continue
            try:
                frames[camera.name] = camera.read()
                self.problems.pop(camera.name, None)
            except CameraLost as error:
                self.problems[camera.name] = str(error)
        return frames

    def send_action(self, action: Sequence[float]) -> None:
        """Noted by the driver's state; the env's step sends it."""

    def stop(self) -> None:
        try:
            self.driver.stop()
        except RobotLinkLost:
            pass  # nothing can be sent; the server's controller holds its last target

    def gripper_closed(self) -> bool | None:
        return self.driver.gripper_closed()

    def gripper_action(self, closed: bool) -> float:
        return self.driver.gripper_action(closed)

    def close(self) -> None:
        """The env closes the arm."""
