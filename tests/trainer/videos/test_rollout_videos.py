"""A run records videos of its episodes: in its first iteration and every N-th, a few
episodes per task (failures and successes in turn), each an mp4 of the env's pictures
that moves, with its record in videos/index.jsonl and over the link (an `episode`
event the protocol accepts) saying who acted at each step, the rewards and the
outcome. A run that asks for none records none; an operator's steps show as human.
Copies in env worker processes are pictured there; RLPD runs record as on-policy ones."""

import av
import numpy as np

from trainer.config.loading import load_config
from trainer.link.protocol import Event
from trainer.runner.on_policy_runner import OnPolicyRunner
from trainer.runner.rlpd_runner import RLPDRunner
from trainer.videos.capture import BORDERS
from trainer.videos.recorder import read_index

QUICK = [
    "env.task_ids=[0,1]", "env.num_parallel_envs=8", "env.max_episode_steps=20",
    "algorithm.data_batch_size=8", "algorithm.update_epochs=1",
    "algorithm.num_minibatches=1", "runner.progress=false", "runner.torch_threads=1",
    "runner.iterations=3", "runner.checkpoint_every=100",
]  # fmt: skip


def run(tmp_path, *overrides: str) -> list[dict]:
    told: list[dict] = []
    config = load_config("examples/builtin_ppo.yaml", [*QUICK, *overrides])
    runner = OnPolicyRunner(config, output_dir=tmp_path, on_video=told.append)
    try:
        runner.learn()
    finally:
        runner.close()
    return told


def test_recorded_iterations_leave_moving_videos_and_their_records(tmp_path):
    told = run(tmp_path, "runner.videos.every=2", "runner.videos.per_task=2",
               "runner.videos.size=64")  # fmt: skip
    index = read_index(tmp_path / "videos")
    # Iterations 1 and 3 (the first and every 2nd), two episodes each.
    assert sorted({row["iteration"] for row in index}) == [1, 3]
    assert len(index) == 4 and told == index
    for row in index:
        Event(seq=1, kind="episode", data=row)  # what the control plane accepts
        assert row["task"] in (0, 1) and row["horizon"] in (5, 10, 15)
        assert set(row["actors"]) == {"policy"} and row["length"] == len(row["rewards"])
        with av.open(str(tmp_path / "videos" / row["file"])) as container:
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        assert frames[0].shape == (64, 64, 3) and len(frames) == row["length"]
        moved = np.abs(frames[0].astype(int) - frames[-1].astype(int)).max()
        assert moved > 50, f"{row['name']}: the picture never changed"


def test_no_videos_unless_asked(tmp_path):
    assert run(tmp_path, "runner.videos.every=0") == []
    assert not (tmp_path / "videos").exists()


def test_an_operators_steps_are_marked_human(tmp_path):
    run(tmp_path, "runner.videos.every=1", "runner.videos.per_task=2",
        "env.interventions.source=scripted", "env.interventions.share=1.0")  # fmt: skip
    index = read_index(tmp_path / "videos")
    assert index and all(row["human_steps"] == row["length"] for row in index)


def test_copies_stepped_by_env_worker_processes_are_pictured_by_their_worker(tmp_path):
    told = run(tmp_path, "env.num_workers=2", "runner.videos.every=1", "runner.iterations=1",
               "runner.videos.per_task=2", "runner.videos.size=64")  # fmt: skip
    index = read_index(tmp_path / "videos")
    assert len(index) == 2 and told == index
    for row in index:
        with av.open(str(tmp_path / "videos" / row["file"])) as container:
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        assert len(frames) == row["length"]
        assert np.abs(frames[0].astype(int) - frames[-1].astype(int)).max() > 50


def test_an_rlpd_run_records_its_episodes_and_the_operators_steps(tmp_path):
    told: list[dict] = []
    config = load_config(
        "examples/builtin_rlpd.yaml",
        ["runner.iterations=2", "runner.progress=false", "env.max_episode_steps=20",
         "algorithm.rlpd.training_starts=1000", "runner.videos.every=1",
         "runner.videos.per_task=4", "env.interventions.share=0.5"],
    )  # fmt: skip
    runner = RLPDRunner(config, output_dir=tmp_path, on_video=told.append)
    try:
        runner.learn()
    finally:
        runner.close()
    index = read_index(tmp_path / "videos")
    assert sorted(row["iteration"] for row in index) == [1] * 4 + [2] * 4
    assert told == index
    for row in index:
        Event(seq=1, kind="episode", data=row)
        assert "horizon" not in row  # RLPD plans no horizons
        assert (tmp_path / "videos" / row["file"]).stat().st_size > 0
    # Half the copies are the scripted operator's: some recorded episode shows its steps,
    # and the video itself marks them with the step bar's orange border.
    assert any(row["human_steps"] for row in index)
    for row in index:
        with av.open(str(tmp_path / "videos" / row["file"])) as container:
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        for frame, actor in zip(frames, row["actors"], strict=True):
            edge = frame[0, frame.shape[1] // 2].astype(int)
            bordered = np.abs(edge - BORDERS["human"]).max() < 60
            assert bordered == (actor == "human"), (row["name"], actor, edge)
