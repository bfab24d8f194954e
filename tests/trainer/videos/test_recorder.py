"""Episode videos: each recorded episode is an H.264 mp4 that decodes to its frames and
a record in the run's index (who acted at each step, the rewards, the outcome), told to
the link; a recorder that falls behind drops whole episodes and never makes the rollout
wait; past the disk budget the middle episodes of a task are thinned, never its first
or newest."""

import threading

import av
import numpy as np
import pytest

from trainer.videos import recorder as recording
from trainer.videos.recorder import EpisodeClip, EpisodeRecorder, read_index


def clip(name: str, task: int = 0, steps: int = 12, size: tuple[int, int] = (48, 64),
         seed: int = 0) -> EpisodeClip:  # fmt: skip
    """A moving square on noise: frames that differ from start to end."""
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 40, (steps + 1, *size, 3), dtype=np.uint8)
    for t in range(steps + 1):
        frames[t, 8:24, 4 * t : 4 * t + 16] = (230, 40, 40)
    actors = ["policy"] * 5 + ["human"] * 4 + ["held"] * (steps - 9)
    return EpisodeClip(name, task, frames, actors, [0.0] * (steps - 1) + [1.0], True,
                       {"init_state": 3, "horizon": 5, "iteration": 2})  # fmt: skip


def decoded(path) -> list[np.ndarray]:
    with av.open(str(path)) as container:
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]


def test_an_episode_becomes_a_playable_mp4_and_a_record(tmp_path):
    told = []
    recorder = EpisodeRecorder(tmp_path, fps=10, on_episode=told.append)
    assert recorder.submit(clip("it2-task0-copy1"))
    stats = recorder.close()
    assert (stats.recorded, stats.dropped, stats.failed) == (1, 0, 0)
    path = tmp_path / "it2-task0-copy1.mp4"
    assert path.read_bytes()[4:8] == b"ftyp"
    frames = decoded(path)
    assert len(frames) == 13 and frames[0].shape == (48, 64, 3)
    assert np.abs(frames[0].astype(int) - frames[-1].astype(int)).mean() > 5  # it moved
    (record,) = read_index(tmp_path)
    assert record == told[0]
    assert record["file"] == "it2-task0-copy1.mp4" and record["bytes"] == path.stat().st_size
    assert (record["task"], record["init_state"], record["horizon"], record["iteration"]) == (
        0, 3, 5, 2,
    )  # fmt: skip
    assert record["success"] is True and record["return"] == 1.0 and record["length"] == 12
    assert record["actors"][4:6] == ["policy", "human"] and record["human_steps"] == 4
    assert not list(tmp_path.glob("*.part"))


def test_odd_sizes_are_cropped_to_even_and_bad_frames_fail_alone(tmp_path):
    recorder = EpisodeRecorder(tmp_path)
    recorder.submit(clip("odd", size=(33, 47)))
    recorder.submit(EpisodeClip("bad", 0, np.zeros((3, 8, 8), np.uint8), [], [], False))
    recorder.submit(clip("after"))
    stats = recorder.close()
    assert (stats.recorded, stats.failed) == (2, 1)
    assert decoded(tmp_path / "odd.mp4")[0].shape == (32, 46, 3)
    assert [r["name"] for r in read_index(tmp_path)] == ["odd", "after"]


def test_a_recorder_behind_drops_whole_episodes_and_never_blocks(tmp_path, monkeypatch):
    release = threading.Event()
    encode = recording.encode_mp4

    def slow(*args):
        release.wait(30)
        return encode(*args)

    monkeypatch.setattr(recording, "encode_mp4", slow)
    recorder = EpisodeRecorder(tmp_path, queue_size=1)
    submitted = [recorder.submit(clip(f"e{i}")) for i in range(5)]
    # One on the encoder (waiting) and one queued at most; the rest dropped at once.
    assert submitted[0] and submitted.count(True) <= 2 and recorder.stats.dropped >= 3
    release.set()
    stats = recorder.close()
    assert stats.recorded + stats.dropped == 5
    assert len(read_index(tmp_path)) == stats.recorded


def test_past_the_budget_a_tasks_middle_episodes_are_thinned(tmp_path):
    one = EpisodeRecorder(tmp_path / "probe")
    one.submit(clip("probe"))
    size = one.close().bytes
    recorder = EpisodeRecorder(tmp_path, max_bytes=int(size * 3.5))
    for i in range(6):
        recorder.submit(clip(f"t0-{i}", task=0, seed=i))
    recorder.submit(clip("t1-0", task=1, seed=9))
    stats = recorder.close()
    assert stats.recorded == 7 and stats.bytes <= size * 3.5 * 1.2
    index = {row["name"]: row for row in read_index(tmp_path)}
    kept = sorted(name for name, row in index.items() if not row.get("thinned"))
    assert {"t0-0", "t0-5", "t1-0"} <= set(kept)  # each task's first and newest
    for name, row in index.items():
        assert (tmp_path / f"{name}.mp4").exists() != bool(row.get("thinned"))
        if row.get("thinned"):
            assert row["task"] == 0 and row["actors"]  # the record stays, marked thinned
    assert stats.thinned == len(index) - len(kept) > 0


@pytest.mark.parametrize("name", ["", "../x", "a b", "x.mp4"])
def test_an_episode_name_is_a_plain_file_stem(tmp_path, name):
    recorder = EpisodeRecorder(tmp_path)
    with pytest.raises(ValueError, match="letters, digits"):
        recorder.submit(clip(name))
    recorder.close()
