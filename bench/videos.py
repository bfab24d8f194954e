"""Benchmarks of episode videos (trainer.videos), two RESULT lines.

`video_overhead`: env steps a second of a training run (the built-in PPO example,
`examples/builtin_ppo.yaml`, its 60 iterations) recording videos at the example's
default (`runner.videos.every: 10`: iterations 1, 11, ..., 51, two episodes of their
task each) against the same run recording none; target >= 0.95. Steps a second are the
run's env steps over the wall time of its iterations (rollouts, updates and the
recorder's thread all in it, and the queued episodes' encoding at the end).

`video_encode`: frames a second the episode recorder encodes, against PyAV's bare
encode of the same frames.

Ours is `trainer.videos.recorder.EpisodeRecorder`: episodes submitted whole, encoded on
its thread to H.264 mp4 files in a folder, each with its index record, until `close`
returns. The baseline encodes the very same frames with PyAV and nothing else: one
in-memory mp4 per episode, same codec, size, preset and quality. Each repeat times
ours and the baseline back to back; the ratio is the median of the repeats' own ratios
(target >= 0.9): what the recorder adds (the queue, the thread, the files, the index)
as a share of the encoding itself.

The episodes are the built-in env's console picture as the console draws it (160 x 160,
the builtin_reach render), 40 steps each.

    .venv/bin/python bench/videos.py [--repeats 7] [--episodes 16] [--run-repeats 7]
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.config.loading import load_config  # noqa: E402
from trainer.envs.builtin_reach import BuiltinReachEnv  # noqa: E402
from trainer.videos.recorder import EpisodeClip, EpisodeRecorder  # noqa: E402

FPS = 10
SIZE = 160
STEPS = 40


def episodes(count: int) -> list[np.ndarray]:
    """`count` episodes of the built-in env's rendered picture, random actions."""
    env = BuiltinReachEnv(num_envs=count, max_episode_steps=STEPS, seed=0)
    env.reset(0, env.init_states(0)[:count])
    frames = [env.render_copies(torch.arange(count), SIZE).numpy()]
    for _ in range(STEPS):
        env.step(torch.rand(count, env.action_dim) * 2 - 1)
        frames.append(env.render_copies(torch.arange(count), SIZE).numpy())
    return list(np.stack(frames, axis=1))  # [count] of [T, H, W, 3]


def ours(clips: list[np.ndarray], folder: Path) -> float:
    started = time.perf_counter()
    recorder = EpisodeRecorder(folder, fps=FPS, max_bytes=2**40, queue_size=len(clips))
    for index, frames in enumerate(clips):
        steps = len(frames) - 1
        recorder.submit(EpisodeClip(f"e{index}", 0, frames, ["policy"] * steps, [0.0] * steps,
                                    False))  # fmt: skip
    stats = recorder.close(timeout=None)
    assert stats.recorded == len(clips), stats
    return len(clips) * len(clips[0]) / (time.perf_counter() - started)


def bare(clips: list[np.ndarray]) -> float:
    import av

    started = time.perf_counter()
    for frames in clips:
        with av.open(io.BytesIO(), "w", format="mp4") as container:
            stream = container.add_stream("libx264", rate=FPS)
            stream.width, stream.height, stream.pix_fmt = SIZE, SIZE, "yuv420p"
            stream.options = {"preset": "veryfast", "crf": "28"}
            for frame in frames:
                container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
            container.mux(stream.encode())
    return len(clips) * len(clips[0]) / (time.perf_counter() - started)


def run_steps_per_second(videos_every: int, iterations: int = 60) -> float:
    from trainer.runner.on_policy_runner import OnPolicyRunner

    with tempfile.TemporaryDirectory() as folder:
        config = load_config("examples/builtin_ppo.yaml", [
            f"runner.iterations={iterations}", "runner.progress=false",
            f"runner.videos.every={videos_every}", "runner.checkpoint_every=1000",
        ])  # fmt: skip
        runner = OnPolicyRunner(config, output_dir=Path(folder))
        started = time.perf_counter()
        try:
            runner.learn()
        finally:
            runner.close()  # the recorder's queued episodes encoded: part of the cost
        seconds = time.perf_counter() - started
        if videos_every:
            assert list(Path(folder, "videos").glob("*.mp4")), "no video was recorded"
        return runner.total_env_steps / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--run-repeats", type=int, default=7)
    args = parser.parse_args()
    example = load_config("examples/builtin_ppo.yaml").runner.videos.every
    overheads = []
    for repeat in range(args.run_repeats):
        recording, plain = run_steps_per_second(example), run_steps_per_second(0)
        overheads.append((recording, plain, recording / plain))
        print(f"run {repeat}: recording {recording:.0f} env steps/s, none {plain:.0f}")
    clips = episodes(args.episodes)
    rates = []
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory() as folder:
            mine = ours(clips, Path(folder) / f"r{repeat}")
        baseline = bare(clips)
        rates.append((mine, baseline, mine / baseline))
        print(f"repeat {repeat}: ours {mine:.0f} frames/s, bare PyAV {baseline:.0f} frames/s")
    mine = statistics.median(r[0] for r in rates)
    baseline = statistics.median(r[1] for r in rates)
    ratio = statistics.median(r[2] for r in rates)
    print(
        f"RESULT bench=video_overhead ours={statistics.median(o[0] for o in overheads):.1f} "
        f"baseline={statistics.median(o[1] for o in overheads):.1f} "
        f"ratio={statistics.median(o[2] for o in overheads):.3f} unit=env_steps/s better=higher"
    )
    print(
        f"RESULT bench=video_encode ours={mine:.1f} baseline={baseline:.1f} "
        f"ratio={ratio:.3f} unit=frames/s better=higher"
    )


if __name__ == "__main__":
    main()
