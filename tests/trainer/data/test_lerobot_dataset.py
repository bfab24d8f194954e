"""Demonstrations as LeRobot datasets (v3.0): the project's writer and reader against
each other, their errors, and against LeRobot's own code.

The tests marked `lerobot` run LeRobot 0.4.4 (tests/trainer/data/lerobot_side.py) in
the virtualenv `./armature install-lerobot` builds; without it they skip with the
reason, unless ARMATURE_REQUIRE_LEROBOT=1, where they fail.
"""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from trainer.data.demo_episodes import split_episodes
from trainer.data.demos import DemoFileError, load_demos, record_demos, save_demos
from trainer.data.intervention_record import InterventionRecord
from trainer.data.lerobot_dataset import read_dataset, write_dataset
from trainer.envs.builtin_reach import INSTRUCTIONS, TASK_NAMES, BuiltinReachEnv
from trainer.envs.intervention import ScriptedReachOperator
from trainer.envs.vision_language import VisionLanguageSpec

ROOT = Path(__file__).resolve().parents[3]
SIDE_SCRIPT = Path(__file__).with_name("lerobot_side.py")
IMAGE = 32

torch.set_num_threads(1)


def state_demos(max_episode_steps: int = 40) -> tuple[dict, torch.Tensor]:
    """Episodes of two tasks (with time-outs when the limit is short) and their task ids."""
    env = BuiltinReachEnv(3, seed=0, max_episode_steps=max_episode_steps)
    parts = {
        task: record_demos(env, ScriptedReachOperator(3), [task], successful_only=False)
        for task in (0, 4)
    }
    demos = {name: torch.cat([part[name] for part in parts.values()]) for name in parts[0]}
    task_ids = torch.cat([torch.full((len(part["obs"]),), task) for task, part in parts.items()])
    return demos, task_ids


@pytest.fixture(scope="module")
def vla_env() -> BuiltinReachEnv:
    return BuiltinReachEnv(3, vision_language=True, image_size=IMAGE)


@pytest.fixture(scope="module")
def vla_demos(vla_env) -> dict:
    operator = ScriptedReachOperator(3, state=vla_env.state_observation)
    demos = record_demos(vla_env, operator, task_ids=[0, 4])
    demos["intervened"][1::3] = False  # some rows the policy's own
    return demos


def episode_ends(demos: dict) -> torch.Tensor:
    ends = torch.zeros(len(demos["obs"]), dtype=torch.bool)
    ends[torch.tensor([len(rows) for rows in split_episodes(demos)]).cumsum(0) - 1] = True
    return ends


def assert_same_transitions(read: dict, written: dict) -> None:
    """Equal rows, but at episodes' ends the next observation is the frame's own."""
    for name in ("obs", "action", "reward", "terminal", "intervened"):
        assert torch.equal(read[name], written[name]), name
    ends = episode_ends(written)
    assert torch.equal(read["next_obs"][~ends], written["next_obs"][~ends])
    assert torch.equal(read["next_obs"][ends], written["obs"][ends])


def test_state_demos_round_trip_with_time_outs_and_task_names(tmp_path):
    demos, task_ids = state_demos(max_episode_steps=5)
    assert 0 < int(demos["terminal"].sum()) < len(split_episodes(demos))  # both endings
    folder = write_dataset(tmp_path / "reach", demos, 10, None, "point_effector", task_ids,
                           TASK_NAMES)  # fmt: skip
    read = read_dataset(folder)
    assert_same_transitions(read, demos)
    info = json.loads((folder / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == 10
    assert info["robot_type"] == "point_effector" and info["total_frames"] == len(demos["obs"])
    assert info["total_episodes"] == len(split_episodes(demos)) and info["total_tasks"] == 2
    assert info["features"]["observation.state"]["shape"] == [19]
    assert {"next.reward", "next.done", "next.success", "complementary_info.is_intervention",
            "timestamp", "frame_index", "episode_index", "index", "task_index"} <= set(
        info["features"])  # fmt: skip
    stats = json.loads((folder / "meta/stats.json").read_text())
    assert stats["action"]["count"] == [len(demos["obs"])] and len(stats["action"]["q50"]) == 7


def test_vision_language_demos_round_trip_as_pictures_proprio_and_instructions(
    tmp_path, vla_env, vla_demos
):
    spec = vla_env.vision_language
    folder = save_demos(tmp_path / "vla", vla_demos, spec, fps=15)
    info = json.loads((folder / "meta/info.json").read_text())
    assert info["features"]["observation.images.camera0"] == {
        "dtype": "image", "shape": [IMAGE, IMAGE, 3], "names": ["height", "width", "channels"]
    }  # fmt: skip
    assert info["features"]["observation.state"]["shape"] == [spec.proprio_dim]
    loaded = load_demos(folder, spec)
    assert_same_transitions(loaded, vla_demos)
    assert set(spec.unpack(loaded["obs"])[2].tolist()) == {0, 4}


def image_demos() -> dict:
    """State demos seen through a camera: each state drawn as its own [3, 8, 8] uint8
    picture (a fixed projection), so episodes chain as the states do."""
    demos, _ = state_demos(max_episode_steps=5)
    projection = torch.randn(
        demos["obs"].shape[1], 3 * 8 * 8, generator=torch.Generator().manual_seed(0)
    )

    def picture(rows: torch.Tensor) -> torch.Tensor:
        return (rows @ projection).mul(40).add(128).clamp(0, 255).to(torch.uint8).view(-1, 3, 8, 8)

    return {**demos, "obs": picture(demos["obs"]), "next_obs": picture(demos["next_obs"])}


def test_an_image_envs_rows_round_trip_as_one_camera(tmp_path):
    demos = image_demos()
    folder = save_demos(tmp_path / "pictures", demos)
    features = json.loads((folder / "meta/info.json").read_text())["features"]
    assert features["observation.images.camera0"]["shape"] == [8, 8, 3]
    assert "observation.state" not in features
    read = load_demos(folder)
    assert read["obs"].dtype == torch.uint8 and read["obs"].shape[1:] == (3, 8, 8)
    assert_same_transitions(read, demos)


def test_rows_of_interleaved_copies_are_written_as_whole_episodes(tmp_path):
    demos, _ = state_demos()
    ends = episode_ends(demos)
    step = torch.cat([torch.arange(len(rows)) for rows in split_episodes(demos)])
    interleaved = torch.sort(step, stable=True).indices  # as record_demos laid rows out before
    shuffled = {name: tensor[interleaved] for name, tensor in demos.items()}
    assert not torch.equal(shuffled["obs"], demos["obs"])
    read = read_dataset(write_dataset(tmp_path / "d", shuffled))
    assert_same_transitions(read, demos)
    assert int(ends.sum()) == len(split_episodes(shuffled))


def test_a_demo_file_name_keeps_the_npz_format(tmp_path):
    demos, _ = state_demos()
    path = save_demos(tmp_path / "reach.npz", demos)
    assert path.is_file()
    loaded = load_demos(path)
    assert all(torch.equal(loaded[name], demos[name]) for name in demos)


def corrupt_info(folder: Path, change) -> None:
    path = folder / "meta/info.json"
    info = json.loads(path.read_text())
    change(info)
    path.write_text(json.dumps(info))


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (lambda f: (f / "meta/info.json").unlink(), "no meta/info.json, not a LeRobot dataset"),
        (lambda f: (f / "meta/info.json").write_text("{"), "meta/info.json is not readable"),
        (lambda f: corrupt_info(f, lambda i: i.update(codebase_version="v2.1")),
         "codebase_version 'v2.1', only 'v3.0' is read"),
        (lambda f: corrupt_info(f, lambda i: i["features"].pop("action")),
         "no feature action"),
        (lambda f: corrupt_info(f, lambda i: i["features"]["observation.state"].update(shape=[5])),
         r"feature observation.state has 19 values per frame, meta/info.json says shape \[5\]"),
        (lambda f: [p.unlink() for p in (f / "data").glob("*/*.parquet")], "no data files"),
        (lambda f: (f / "data/chunk-000/file-000.parquet").write_text("x"),
         "data/chunk-000/file-000.parquet is not a readable parquet file"),
    ],
)  # fmt: skip
def test_a_bad_dataset_is_named_with_what_is_wrong(tmp_path, spoil, message):
    demos, _ = state_demos()
    folder = write_dataset(tmp_path / "bad", demos)
    spoil(folder)
    with pytest.raises(DemoFileError, match=message) as raised:
        load_demos(folder)
    assert str(folder) in str(raised.value)


def test_pictures_that_do_not_fit_the_env_are_refused(tmp_path, vla_env, vla_demos):
    spec = vla_env.vision_language
    folder = write_dataset(tmp_path / "vla", vla_demos, vision_language=spec)
    small = VisionLanguageSpec((3, 16, 16), 1, spec.proprio_dim, spec.instructions)
    with pytest.raises(DemoFileError, match=r"observation.images.camera0 has pictures of shape "
                       r"\[32, 32, 3\] \(H, W, C\), the env's are \[16, 16, 3\]"):  # fmt: skip
        read_dataset(folder, small)
    two = VisionLanguageSpec(spec.image_shape, 2, spec.proprio_dim, spec.instructions)
    with pytest.raises(DemoFileError, match="1 camera features .*camera0.*hold 2 pictures"):
        read_dataset(folder, two)
    other = VisionLanguageSpec(spec.image_shape, 1, spec.proprio_dim, ("open the drawer",))
    with pytest.raises(DemoFileError, match=f"task '{INSTRUCTIONS[0]}' is none of the env's"):
        read_dataset(folder, other)
    with pytest.raises(DemoFileError, match=r"observation.state has shape \[4\], the env's prop"):
        read_dataset(folder, VisionLanguageSpec(spec.image_shape, 1, 5, spec.instructions))


def test_a_folder_that_is_not_a_dataset_is_neither_read_nor_overwritten(tmp_path):
    demos, _ = state_demos()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes/todo.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not a LeRobot dataset"):
        save_demos(tmp_path / "notes", demos)
    with pytest.raises(DemoFileError, match="no meta/info.json"):
        load_demos(tmp_path / "notes")
    assert (tmp_path / "notes/todo.txt").read_text() == "keep me"
    first = save_demos(tmp_path / "data", demos)
    half = {name: tensor[: len(tensor) // 2] for name, tensor in demos.items()}
    assert save_demos(tmp_path / "data", half) == first  # a dataset is replaced whole
    assert len(load_demos(first)["obs"]) == len(half["obs"])


# ----- against LeRobot's own code ---------------------------------------------------------


@pytest.fixture(scope="module")
def lerobot_python() -> Path:
    """The python of LeRobot's side virtualenv."""
    named = os.environ.get("ARMATURE_LEROBOT_PYTHON")
    if named:
        python = Path(named)
    else:
        script = ROOT / "deploy/install_lerobot.sh"
        printed = subprocess.run(["bash", str(script), "--print-python"], check=True,
                                 capture_output=True, text=True, timeout=30)  # fmt: skip
        python = Path(printed.stdout.strip())
    if not python.is_file():
        reason = f"LeRobot's virtualenv is not built ({python}): ./armature install-lerobot"
        if os.environ.get("ARMATURE_REQUIRE_LEROBOT") == "1":
            pytest.fail(f"ARMATURE_REQUIRE_LEROBOT=1 but {reason}")
        pytest.skip(f"{reason} (ARMATURE_REQUIRE_LEROBOT=1 fails instead)")
    return python


def run_lerobot(python: Path, tmp_path: Path, *arguments: str) -> None:
    """LeRobot's side script, offline, with its caches in the test's folder."""
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                   "HF_HOME": str(tmp_path / "hf"), "OMP_NUM_THREADS": "1"}  # fmt: skip
    environment.pop("PYTHONPATH", None)
    result = subprocess.run(
        [str(python), str(SIDE_SCRIPT), *map(str, arguments)],
        env=environment, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]


def lerobot_written(python: Path, tmp_path: Path, frames: dict, features: dict, storage: str):
    np.savez(tmp_path / "frames.npz", **frames)
    (tmp_path / "features.json").write_text(json.dumps(features))
    folder = tmp_path / "theirs"
    run_lerobot(python, tmp_path, "write", tmp_path / "frames.npz", tmp_path / "features.json",
                folder, 10, storage)  # fmt: skip
    return folder


def camera_frames(count: int, size: int, seed: int) -> np.ndarray:
    """Flat colours with a bright square, a different colour per frame: pictures a lossy
    video codec keeps close and never confuses with another frame's."""
    rng = np.random.default_rng(seed)
    frames = np.empty((count, size, size, 3), dtype=np.uint8)
    for index in range(count):
        frames[index] = rng.integers(30, 220, size=3)
        corner = (index * 5) % (size // 2)
        frames[index, corner : corner + size // 4, corner : corner + size // 4] = 250
    return frames


def recorded_frames(size: int) -> tuple[dict, dict, VisionLanguageSpec]:
    """Two episodes (a success, then a time-out) as LeRobot's HIL-SERL recorder writes
    them, with two cameras named as a user's robot names them."""
    lengths, rng = (4, 3), np.random.default_rng(0)
    count = sum(lengths)
    frames = {
        "observation.images.front": camera_frames(count, size, 1),
        "observation.images.wrist": camera_frames(count, size, 2),
        "observation.state": rng.normal(size=(count, 4)).astype(np.float32),
        "action": rng.uniform(-1, 1, (count, 7)).astype(np.float32),
        "next.reward": np.array([[0], [0], [0], [1], [0], [0], [0]], np.float32),
        "next.done": np.array([[0], [0], [0], [1], [0], [0], [1]], bool),
        "complementary_info.is_intervention": np.array([[1], [0], [1], [1], [0], [0], [1]], bool),
        "complementary_info.discrete_penalty": np.zeros((count, 1), np.float32),
        "episode": np.repeat([0, 1], lengths),
        "task": np.array([INSTRUCTIONS[2]] * 4 + [INSTRUCTIONS[5]] * 3),
    }  # fmt: skip
    picture = {"dtype": "image", "shape": [size, size, 3],
               "names": ["height", "width", "channels"]}  # fmt: skip
    features = {
        "observation.images.front": picture,
        "observation.images.wrist": picture,
        "observation.state": {"dtype": "float32", "shape": [4], "names": None},
        "action": {"dtype": "float32", "shape": [7], "names": None},
        "next.reward": {"dtype": "float32", "shape": [1], "names": None},
        "next.done": {"dtype": "bool", "shape": [1], "names": None},
        "complementary_info.is_intervention": {"dtype": "bool", "shape": [1], "names": None},
        "complementary_info.discrete_penalty": {"dtype": "float32", "shape": [1], "names": None},
    }
    spec = VisionLanguageSpec((3, size, size), 2, 4, INSTRUCTIONS)
    return frames, features, spec


def check_recorded(loaded: dict, frames: dict, spec: VisionLanguageSpec, exact: bool) -> None:
    images, proprio, task_ids = spec.unpack(loaded["obs"])
    assert task_ids.tolist() == [2] * 4 + [5] * 3
    torch.testing.assert_close(proprio, torch.from_numpy(frames["observation.state"]))
    pictures = images.mul(255).round().to(torch.uint8).permute(0, 1, 3, 4, 2).numpy()
    for camera, name in enumerate(("observation.images.front", "observation.images.wrist")):
        ours, theirs = pictures[:, camera].astype(int), frames[name].astype(int)
        if exact:
            assert np.array_equal(ours, theirs), name
        else:  # a lossy codec: close, and each frame nearest its own source frame
            error = np.abs(ours[:, None] - theirs[None]).mean(axis=(2, 3, 4))
            assert error.diagonal().max() < 12, error.diagonal()  # others: 20 and more
            assert (error.argmin(axis=1) == np.arange(len(ours))).all()
    torch.testing.assert_close(loaded["action"], torch.from_numpy(frames["action"]))
    assert loaded["reward"].tolist() == frames["next.reward"][:, 0].tolist()
    # The success ends with reward 1, the time-out with 0: only the success is terminal.
    assert loaded["terminal"].tolist() == [False, False, False, True, False, False, False]
    assert (
        loaded["intervened"].tolist() == frames["complementary_info.is_intervention"][:, 0].tolist()
    )
    assert torch.equal(loaded["next_obs"][[0, 1, 2, 4, 5]], loaded["obs"][[1, 2, 3, 5, 6]])
    assert torch.equal(loaded["next_obs"][[3, 6]], loaded["obs"][[3, 6]])  # episodes' ends


@pytest.mark.lerobot
def test_a_dataset_lerobot_records_is_read_as_demos(tmp_path, lerobot_python):
    frames, features, spec = recorded_frames(IMAGE)
    folder = lerobot_written(lerobot_python, tmp_path, frames, features, "images")
    check_recorded(load_demos(folder, spec), frames, spec, exact=True)
    state_only = load_demos(folder)
    torch.testing.assert_close(state_only["obs"], torch.from_numpy(frames["observation.state"]))


@pytest.mark.lerobot
def test_a_dataset_lerobot_records_with_videos_is_decoded(tmp_path, lerobot_python):
    frames, features, spec = recorded_frames(64)  # SVT-AV1's smallest pictures
    for name in ("observation.images.front", "observation.images.wrist"):
        features[name] = {**features[name], "dtype": "video"}
    folder = lerobot_written(lerobot_python, tmp_path, frames, features, "videos")
    info = json.loads((folder / "meta/info.json").read_text())
    assert info["features"]["observation.images.front"]["info"]["video.codec"] == "av1"
    check_recorded(load_demos(folder, spec), frames, spec, exact=False)
    (folder / "videos/observation.images.wrist/chunk-000/file-000.mp4").write_bytes(b"junk")
    with pytest.raises(DemoFileError, match="video feature observation.images.wrist: .* cannot "
                       "be decoded here .*use_videos=False"):  # fmt: skip
        load_demos(folder, spec)


@pytest.mark.lerobot
def test_lerobot_opens_the_datasets_the_project_writes(tmp_path, lerobot_python, vla_env,
                                                       vla_demos):  # fmt: skip
    spec = vla_env.vision_language
    folder = save_demos(tmp_path / "ours", vla_demos, spec, fps=15)
    run_lerobot(lerobot_python, tmp_path, "read", folder, tmp_path / "theirs.npz")
    with np.load(tmp_path / "theirs.npz") as data:
        theirs = {name: data[name] for name in data.files}
    ours = read_dataset(folder, spec)
    images, proprio, task_ids = spec.unpack(vla_demos["obs"])
    pictures = images[:, 0].mul(255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    assert np.array_equal(theirs["observation.images.camera0"], pictures)
    assert np.array_equal(theirs["observation.state"], proprio.numpy())
    assert np.array_equal(theirs["action"], vla_demos["action"].numpy())
    assert theirs["task"].tolist() == [INSTRUCTIONS[task] for task in task_ids.tolist()]
    assert np.array_equal(theirs["next.reward"], vla_demos["reward"].numpy())
    assert np.array_equal(theirs["next.success"], vla_demos["terminal"].numpy())
    assert np.array_equal(theirs["next.done"], episode_ends(vla_demos).numpy())
    intervened = theirs["complementary_info.is_intervention"]
    assert np.array_equal(intervened, vla_demos["intervened"].numpy())
    assert int(theirs["info.fps"]) == 15
    assert int(theirs["info.total_episodes"]) == len(split_episodes(vla_demos))
    assert np.array_equal(theirs["index"], np.arange(len(vla_demos["obs"])))
    # LeRobot's RL replay buffer takes the same next states as the project's reader.
    assert np.array_equal(theirs["buffer.next_state"], spec.unpack(ours["next_obs"])[1].numpy())
    assert np.array_equal(theirs["buffer.done"], theirs["next.done"])


@pytest.mark.lerobot
def test_lerobot_opens_recorded_interventions_and_an_image_envs_rows(tmp_path, lerobot_python):
    demos, task_ids = state_demos(max_episode_steps=5)
    record = InterventionRecord()
    for task in (0, 4):  # an operator drove every other row, the policy the rest
        rows = {name: tensor[task_ids == task] for name, tensor in demos.items()}
        rows["intervened"] = torch.arange(len(rows["obs"])) % 2 == 0
        record.task_id = task
        record.add(rows)
    folder = record.write(tmp_path / "interventions", None, TASK_NAMES.__getitem__, fps=20)
    kept, kept_tasks = record.transitions()
    order = torch.cat(split_episodes(kept))
    run_lerobot(lerobot_python, tmp_path, "read", folder, tmp_path / "theirs.npz")
    with np.load(tmp_path / "theirs.npz") as data:
        assert np.array_equal(data["observation.state"], kept["obs"][order].numpy())
        assert np.array_equal(data["action"], kept["action"][order].numpy())
        assert data["complementary_info.is_intervention"].all()
        assert data["task"].tolist() == [TASK_NAMES[task] for task in kept_tasks[order].tolist()]
    pictures = image_demos()
    folder = save_demos(tmp_path / "pictures", pictures)
    run_lerobot(lerobot_python, tmp_path, "read", folder, tmp_path / "pictures.npz")
    with np.load(tmp_path / "pictures.npz") as data:
        theirs = data["observation.images.camera0"]
    assert np.array_equal(theirs, pictures["obs"].permute(0, 2, 3, 1).numpy())
