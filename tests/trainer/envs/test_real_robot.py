"""Real arms as an env, against fake SERL robot servers and a fake MJPEG camera: every
arm resets and steps at once, its state is the observation, every pose sent lies in its
safety box, a dead server is a named env error the runner's recovery reaches again, the
console sees each arm's camera and its e-stop reaches the arm, and an RLPD run trains
on the arms from a config."""

import json
import threading
import time

import numpy as np
import pytest
import torch
import yaml

from tests.processes import wait_until
from tests.trainer.hardware.fake_camera import FakeCamera
from tests.trainer.hardware.fake_serl_server import HOME, fake_servers
from trainer.config.errors import ConfigError
from trainer.config.loading import load_config
from trainer.envs.pictures import pictures_of
from trainer.envs.real_robot import OBS_DIM, RobotConsoleView
from trainer.envs.registry import make_vector_env
from trainer.envs.success_classifier import (
    load_classifier,
    save_classifier,
    train_success_classifier,
)
from trainer.envs.vector_env import EnvWorkerError
from trainer.hardware.serl_franka import SafetyBox
from trainer.runner.build import env_options
from trainer.runner.on_policy_runner import OnPolicyRunner
from trainer.runner.rlpd_runner import RLPDRunner

pytestmark = pytest.mark.timeout(120)

BOX = {"xyz_low": [0.4, -0.1, 0.05], "xyz_high": [0.6, 0.1, 0.3],
       "rpy_low": [2.8, -0.3, -0.5], "rpy_high": [3.1416, 0.3, 0.5]}  # fmt: skip


@pytest.fixture
def servers():
    with fake_servers(2) as fakes:
        yield fakes


def robots(servers, **extra) -> list[dict]:
    return [
        {"name": f"franka-{index}", "url": server.url, "safety_box": BOX, "control_hz": 100.0,
         "timeout_s": 2.0, "action_scale": [0.02, 0.1, 1.0], "joint_reset": False,
         "reset_pose": [0.5, 0.0, 0.2, 1.0, 0.0, 0.0, 0.0], **extra}
        for index, server in enumerate(servers)
    ]  # fmt: skip


def config(servers, tmp_path, *overrides: str, **extra):
    document = {
        "name": "arms",
        "env": {"name": "real_robot", "num_parallel_envs": 2, "max_episode_steps": 6,
                "real_robot": {"task": "push the block", "robots": robots(servers, **extra),
                               "reconnect_s": 3.0}},
        "algorithm": {"name": "rlpd", "rlpd": {"batch_size": 16, "training_starts": 8,
                                               "hidden_sizes": [32, 32]}},
        "runner": {"iterations": 2, "seed": 0, "progress": False,
                   "output_dir": str(tmp_path / "run"), "torch_threads": 1},
    }  # fmt: skip
    path = tmp_path / "arms.yaml"
    path.write_text(yaml.safe_dump(document))
    return load_config(path, list(overrides))


def test_the_arms_reset_and_step_together_inside_their_boxes(servers, tmp_path):
    env = make_vector_env("real_robot", 2, **env_options(config(servers, tmp_path)))
    try:
        assert env.task_name(0) == "push the block" and env.obs_shape == (OBS_DIM,)
        obs = env.reset(0, env.init_states(0).expand(2, -1))
        assert obs.shape == (2, OBS_DIM)
        assert obs[:, :7].tolist() == [pytest.approx(HOME[:1] + [0.0, 0.2] + HOME[3:])] * 2
        for server in servers:
            assert server.endpoints()[:4] == ["getstate", "getstate", "clearerr", "pose"]
        push = torch.tensor([[1.0, 0, 0, 0, 0, 0, 0], [0, -1.0, 0, 0, 0, 0, 0]])
        steps = [env.step(push.unsqueeze(1).expand(-1, 3, -1)) for _ in range(2)]
        assert [bool(s.truncated.all()) for s in steps] == [False, True]  # 6 actions
        assert servers[0].pose[0] == pytest.approx(0.6)  # 0.5 + 6 x 0.02, clipped at 0.6
        assert servers[1].pose[1] == pytest.approx(-0.1)
        box = SafetyBox(*(tuple(BOX[key]) for key in ("xyz_low", "xyz_high", "rpy_low",
                                                      "rpy_high")))  # fmt: skip
        assert all(box.holds(pose) for server in servers for pose in server.posed())
        assert steps[-1].obs[0, 0].item() == pytest.approx(0.6)
    finally:
        env.close()


def test_a_dead_server_is_a_named_env_error_until_it_answers_again(servers, tmp_path):
    env = make_vector_env("real_robot", 2, **env_options(config(servers, tmp_path)))
    try:
        env.reset(0, env.init_states(0).expand(2, -1))
        servers[1].stop()
        with pytest.raises(EnvWorkerError, match=r"franka-1: .* did not answer"):
            env.step(torch.zeros(2, 7))
        with pytest.raises(EnvWorkerError, match=r"franka-1: .*\(away for 3 s\)"):
            env.restart_workers()
        servers[1].start()  # the same port
        assert env.restart_workers() == ["franka-1 reached again"]
        env.step(torch.zeros(2, 7))
    finally:
        env.close()


def test_the_console_sees_each_arms_camera_and_its_estop_reaches_the_arm(servers, tmp_path):
    camera = FakeCamera()
    try:
        options = env_options(
            config(servers, tmp_path, cameras=[{"name": "wrist", "url": camera.url("stream")}])
        )
        env = make_vector_env("real_robot", 2, **options)
        try:
            view = RobotConsoleView(env.drivers[0], env.cameras[0])
            assert view.read_cameras()["wrist"].shape == (32, 32, 3)
            env.reset(0, env.init_states(0).expand(2, -1))
            assert view.read_state()["pose"][:3] == pytest.approx([0.5, 0.0, 0.2])
            sent = len(servers[0].posed())
            view.stop()
            assert len(servers[0].posed()) == sent + 1  # held where it is, at once
        finally:
            env.close()
    finally:
        camera.stop()


def test_episode_videos_picture_each_arms_cameras_side_by_side(servers, tmp_path):
    camera = FakeCamera()
    camera.red = 77
    try:
        cameras = [{"name": "wrist", "url": camera.url("stream")},
                   {"name": "top", "url": camera.url("snapshot")}]  # fmt: skip
        options = env_options(config(servers, tmp_path, cameras=cameras))
        env = make_vector_env("real_robot", 2, **options)
        try:
            pictures = pictures_of(env, 16)([0, 1])
        finally:
            env.close()
        assert pictures.shape == (2, 16, 32, 3)  # the wrist's, then the top camera's
        for half in (pictures[:, :, :16], pictures[:, :, 16:]):
            assert np.abs(half[..., 0].astype(int) - 77).max() <= 6
            assert np.abs(half[..., 1].astype(int) - 100).max() <= 6
        without = make_vector_env("real_robot", 2, **env_options(config(servers, tmp_path)))
        try:
            assert pictures_of(without, 16) is None  # arms without cameras: no videos
        finally:
            without.close()
    finally:
        camera.stop()


def test_bad_arm_configs_are_named(servers, tmp_path):
    with pytest.raises(ValueError, match=r"lists 2 arms for 3 env copies"):
        make_vector_env("real_robot", 3, **env_options(config(servers, tmp_path)))
    with pytest.raises(ConfigError, match=r"safety_box"):
        config(servers, tmp_path, safety_box={"xyz_low": [0, 0]})


def test_an_rlpd_run_trains_on_the_arms(servers, tmp_path):
    runner = RLPDRunner(config(servers, tmp_path))
    runner.learn()
    rows = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert [row["iteration"] for row in rows] == [1, 2]
    assert rows[-1]["buffers/online"] == 2 * 2 * 6  # two arms, two episodes of six steps
    assert all(len(server.posed()) >= 12 for server in servers)


def test_an_rlpd_run_stops_reports_and_recovers_when_an_arms_server_dies_and_comes_back(
    servers, tmp_path
):
    recoveries = []
    runner = RLPDRunner(
        config(servers, tmp_path, "runner.iterations=3", control_hz=10.0),
        on_recovery=lambda iteration, what: recoveries.append((iteration, what)),
    )
    dying = servers[1]
    gone_after = 10  # poses, 7 an iteration (the reset's and six steps'): the second's

    def die_and_come_back() -> None:
        wait_until(lambda: len(dying.posed()) >= gone_after, 60, "the second iteration", 0.01)
        dying.stop()
        time.sleep(1.0)
        dying.start()

    helper = threading.Thread(target=die_and_come_back)
    helper.start()
    try:
        runner.learn()
    finally:
        helper.join()
    rows = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert [row["iteration"] for row in rows] == [1, 2, 3]
    ((iteration, what),) = recoveries
    assert iteration == 2 and "franka-1" in what and "reached again" in what


def flat_pictures(folder, red: int, count: int) -> None:
    from PIL import Image

    folder.mkdir(parents=True)
    for index in range(count):
        size = 32 if index % 2 else 48  # frames of several sizes are resized alike
        picture = np.zeros((size, size, 3), dtype=np.uint8)
        picture[..., 0], picture[..., 1] = red + index % 7, 100
        Image.fromarray(picture).save(folder / f"{index}.png")


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """A classifier that learnt a red scene is a success and a dark one is not."""
    folder = tmp_path_factory.mktemp("frames")
    flat_pictures(folder / "success", 220, 12)
    flat_pictures(folder / "failure", 30, 24)
    trained = train_success_classifier(folder, image_size=16, epochs=40)
    assert trained.held_out_accuracy == 1.0
    path = folder / "classifier.pt"
    save_classifier(trained, path)
    return path


def test_the_learned_classifier_ends_an_episode_in_success_from_the_camera(
    servers, tmp_path, classifier
):
    camera = FakeCamera()
    camera.red = 30
    try:
        arms = config(servers, tmp_path, cameras=[{"name": "wrist", "url": camera.url("stream")}])
        options = env_options(arms)
        options["success_classifier"] = {"path": str(classifier), "camera": "wrist"}
        env = make_vector_env("real_robot", 2, **options)
        try:
            env.reset(0, env.init_states(0).expand(2, -1))
            step = env.step(torch.zeros(2, 7))
            assert not step.success.any() and not step.terminated.any()
            camera.red = 220  # the scene now shows the task solved
            wait_until(lambda: env.cameras[0][0].read()[0, 0, 0] > 200, 10, "the red frames")
            step = env.step(torch.zeros(2, 7))
            assert step.success.all() and step.terminated.all() and not step.truncated.any()
            assert step.reward.tolist() == [1.0, 1.0]
        finally:
            env.close()
        with pytest.raises(ValueError, match=r"arm 0 has no camera top \(its cameras: wrist\)"):
            options["success_classifier"] = {"path": str(classifier), "camera": "top"}
            make_vector_env("real_robot", 2, **options)
    finally:
        camera.stop()


def test_a_config_names_the_classifier_and_a_bad_file_is_refused(servers, tmp_path, classifier):
    arms = config(servers, tmp_path, f"env.real_robot.success_classifier.path={classifier}")
    assert env_options(arms)["success_classifier"] == {
        "path": str(classifier), "camera": None, "threshold": None,
    }  # fmt: skip
    not_one = tmp_path / "weights.pt"
    torch.save({"state": {}}, not_one)
    with pytest.raises(ValueError, match=r"weights.pt: not a success classifier"):
        load_classifier(not_one)


def test_taking_over_an_arm_holding_an_object_never_opens_its_gripper(servers, tmp_path):
    """HIL-SERL's arms close at -1: the console's gripper (+1 closed, -1 open) is turned
    into the arm's own command, and a takeover starts from what the arm holds."""
    from trainer.runner.interventions import close_env, with_interventions

    run = config(servers, tmp_path, "env.interventions.source=console",
                 "env.interventions.deadman_s=5")  # fmt: skip
    env = with_interventions(make_vector_env("real_robot", 2, **env_options(run)), run, None)
    try:
        env.reset(0, env.init_states(0).expand(2, -1))
        closing = torch.zeros(2, 7)
        closing[:, 6] = -1.0  # the policy closes both grippers (HIL-SERL's -1)
        env.step(closing)
        assert servers[0].gripper_pos == 0.0
        env.console.handle(console_command("take_over"))
        env.console.publish()
        start = len(servers[0].requests)
        for gripper in (-1.0, -1.0, 0.0):  # a console that started from "open", then 0
            env.console.handle(console_command("command", action=[0.5, 0, 0, 0, 0, 0, gripper]))
            env.step(torch.zeros(2, 7))
        sent = [endpoint for endpoint, _ in servers[0].requests[start:]]
        assert "open_gripper" not in sent and servers[0].gripper_pos == 0.0
        assert "pose" in sent  # the operator's motion did reach the arm
        # The operator's own command: closed (as it is), then open.
        for gripper in (1.0, -1.0):
            env.console.handle(console_command("command", action=[0, 0, 0, 0, 0, 0, gripper]))
            env.step(torch.zeros(2, 7))
        assert servers[0].gripper_pos == 1.0
        assert [e for e, _ in servers[0].requests[start:]].count("open_gripper") == 1
    finally:
        close_env(env)


def console_command(op: str, **fields) -> dict:
    return {"type": "teleop", "op": op, "operator": "olga", "robot": 0,
            "sent_at": time.monotonic(), "clock": "web-1", **fields}  # fmt: skip


def pi0_on_arms(servers, tmp_path, cameras, *overrides: str):
    """A π0 run's config on the two arms, each with `cameras`."""
    return config(
        servers, tmp_path, "algorithm.name=ppo", "actor.model.kind=vla",
        f"actor.model.path={tmp_path / 'pi0'}", "actor.model.build_tiny=true",
        "actor.model.tiny_family=pi0", "env.image_size=32", "env.max_episode_steps=10",
        "rollout.action_horizons_pattern=[5,10]", "algorithm.data_batch_size=2",
        "critic.hidden_sizes=[16]", *overrides, cameras=cameras,
    )  # fmt: skip


def test_a_pi0_sees_each_arms_cameras_state_and_task_and_trains_on_the_arms(servers, tmp_path):
    front, wrist = FakeCamera(), FakeCamera()
    cameras = [{"name": "front", "url": front.url("stream")},
               {"name": "wrist", "url": wrist.url("snapshot")}]  # fmt: skip
    try:
        settings = pi0_on_arms(servers, tmp_path, cameras)
        env = make_vector_env("real_robot", 2, **env_options(settings))
        try:
            spec = env.vision_language
            assert spec.num_images == 2 and spec.proprio_dim == OBS_DIM
            assert spec.instructions == ("push the block",) and spec.image_shape == (3, 32, 32)
            images, proprio, tasks = spec.unpack(env.reset(0, env.init_states(0).expand(2, -1)))
            assert images.shape == (2, 2, 3, 32, 32) and tasks.tolist() == [0, 0]
            # The fake cameras' frames: green 100 of 255 everywhere.
            assert images[:, :, 1].mean().item() == pytest.approx(100 / 255, abs=0.02)
            assert proprio[:, :3].tolist() == [pytest.approx([0.5, 0.0, 0.2])] * 2
            wrist.stop()
            with pytest.raises(EnvWorkerError, match=r"franka-0: .*wrist"):
                env.step(torch.zeros(2, 5, 7))
        finally:
            env.close()
    finally:
        front.stop()
    front, wrist = FakeCamera(), FakeCamera()
    cameras = [{"name": "front", "url": front.url("stream")},
               {"name": "wrist", "url": wrist.url("snapshot")}]  # fmt: skip
    try:
        runner = OnPolicyRunner(pi0_on_arms(servers, tmp_path, cameras, "runner.iterations=1"))
        assert type(runner.algorithm.policy).__name__ == "Pi0ChunkPolicy"
        [row] = runner.learn()
        assert row["rollout/episodes"] == 2 and np.isfinite(row["losses/value_loss"])
        assert all(len(server.posed()) >= 10 for server in servers)  # ten actions each
        runner.close()
    finally:
        front.stop(), wrist.stop()


def test_a_vla_on_arms_without_cameras_is_refused(servers, tmp_path):
    options = env_options(pi0_on_arms(servers, tmp_path, []))
    with pytest.raises(ValueError, match=r"same number of them, at least one .*franka-0: 0"):
        make_vector_env("real_robot", 2, **options)
