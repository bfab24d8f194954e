import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer.commands.run import add_parser, main, run
from trainer.config import load_config
from trainer.runner.on_policy_runner import OnPolicyRunner

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[3]
TIMING = ("charts/SPS", "charts/samples_per_s", "charts/iteration_seconds")
SMALL = [
    "env.num_parallel_envs=4",
    "algorithm.data_batch_size=8",
    "runner.progress=false",
    "algorithm.update_epochs=1",
    "algorithm.num_minibatches=2",
    "runner.torch_threads=1",
]


def _config(tmp_path, name, *overrides):
    return load_config(
        REPO / "examples" / name,
        [*SMALL, f"runner.output_dir={tmp_path}", *overrides],
    )


def _without_timing(history):
    return [{k: v for k, v in m.items() if k not in TIMING} for m in history]


def test_run_writes_metrics_checkpoints_and_the_resolved_config(tmp_path, capsys):
    status = run(
        [
            str(REPO / "examples" / "builtin_ppo.yaml"),
            *SMALL,
            f"runner.output_dir={tmp_path}",
            "runner.iterations=3",
            "runner.checkpoint_every=2",
        ]
    )
    assert status == 0
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [line["iteration"] for line in lines] == [1, 2, 3]
    for name in (
        "rollout/success_rate",
        "rollout/plan_success_rate_h5",
        "rollout/plan_success_rate_h10",
        "rollout/plan_success_rate_h15",
        "rollout/success_rate_task_0",
        "rollout/episode_return",
        "rollout/episode_length",
        "losses/policy_loss",
        "losses/value_loss",
        "losses/entropy",
        "losses/approx_kl",
        "losses/clip_fraction",
        "charts/SPS",
        "charts/samples_per_s",
        "charts/iteration_seconds",
    ):
        assert name in lines[0], name
    assert lines[1]["rollout/task_id"] == 1.0  # the task cursor moved on
    checkpoints = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert checkpoints == ["iter_000002.pt", "iter_000003.pt"]
    assert load_config(tmp_path / "config.yaml").runner.iterations == 3
    assert "finished 3/3 iterations" in capsys.readouterr().out


def test_config_errors_exit_2_and_name_the_key_path(tmp_path, capsys):
    status = run(
        [
            str(REPO / "examples" / "builtin_ppo.yaml"),
            "rollout.action_horizons_pattern=[5,12]",
            "env.task_ids=[0, 9]",
        ]
    )
    assert status == 2
    err = capsys.readouterr().err
    assert "rollout.action_horizons_pattern[1]: 12 must be a multiple of" in err
    status = run(
        [
            str(REPO / "examples" / "builtin_ppo.yaml"),
            "env.task_ids=[0, 9]",
            f"runner.output_dir={tmp_path}",
        ]
    )
    assert status == 2
    assert "env.task_ids[1]: builtin_reach has tasks 0..5, not 9" in capsys.readouterr().err
    for override, expected in [
        ("actor.model.kind=cnn", "actor.model.kind: a CNN needs [C, H, W] observations"),
        ("env.camera=true", "actor.model.kind: an MLP needs flat observations, got shape"),
        ("env.name=libero_nope", "env.name: unknown env 'libero_nope'"),
        ("actor.model.action_dim=6", "actor.model.action_dim: 6 is fewer than the env's 7"),
    ]:
        status = run(
            [str(REPO / "examples" / "builtin_ppo.yaml"), override, f"runner.output_dir={tmp_path}"]
        )
        assert status == 2
        assert expected in capsys.readouterr().err


def test_resume_needs_a_checkpoint(tmp_path, capsys):
    status = run(
        [str(REPO / "examples" / "builtin_ppo.yaml"), f"runner.output_dir={tmp_path}", "--resume"]
    )
    assert status == 2
    assert "no checkpoint to resume" in capsys.readouterr().err


@pytest.mark.parametrize("example", ["builtin_ppo.yaml", "builtin_grpo.yaml"])
def test_seeded_runs_are_reproducible_and_resume_continues_exactly(tmp_path, example):
    straight = OnPolicyRunner(_config(tmp_path / "a", example, "runner.iterations=4"))
    expected = _without_timing(straight.learn())
    again = OnPolicyRunner(_config(tmp_path / "b", example, "runner.iterations=4"))
    assert _without_timing(again.learn()) == expected
    first_half = OnPolicyRunner(_config(tmp_path / "c", example, "runner.iterations=2"))
    first_half.learn()
    resumed = OnPolicyRunner(_config(tmp_path / "c", example, "runner.iterations=4"))
    assert _without_timing(resumed.learn(resume=True)) == expected[2:]
    lines = (tmp_path / "c" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["iteration"] for line in lines] == [1, 2, 3, 4]


def test_env_workers_in_processes_give_the_same_run(tmp_path):
    in_process = OnPolicyRunner(_config(tmp_path / "a", "builtin_ppo.yaml", "runner.iterations=2"))
    expected = _without_timing(in_process.learn())
    config = _config(tmp_path / "b", "builtin_ppo.yaml", "runner.iterations=2", "env.num_workers=2")
    with_workers = OnPolicyRunner(config)
    try:
        assert _without_timing(with_workers.learn()) == expected
    finally:
        with_workers.close()


def test_run_registers_on_the_trainer_dispatcher(tmp_path):
    parser = argparse.ArgumentParser(prog="python -m trainer")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(
        ["run", "examples/builtin_ppo.yaml", "runner.iterations=1", "--resume"]
    )
    assert args.handler is main
    assert args.overrides == ["runner.iterations=1"] and args.resume is True


def test_the_training_stack_never_imports_django():
    code = (
        "import sys, trainer.commands.run, trainer.config, trainer.envs;"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('django', 'controlplane')];"
        "assert not bad, bad"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


def test_the_module_runs_as_a_command(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer.commands.run",
            str(REPO / "examples" / "builtin_grpo.yaml"),
            *SMALL,
            "runner.iterations=2",
            f"runner.output_dir={tmp_path}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "finished 2/2 iterations" in result.stdout


def test_the_output_dir_defaults_to_var_runs_and_the_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_config(None, ["name=reach-demo", "runner.progress=false"])
    runner = OnPolicyRunner(config)
    assert runner.output_dir == Path("var/runs/reach-demo")
    assert not (tmp_path / "var").exists()  # nothing is written before learn()


def test_output_dir_wins_over_the_config_and_the_name_cannot_leave_var_runs(tmp_path):
    target = tmp_path / "run 7: artifacts"  # a space, a colon: read back as written
    status = run(
        [
            str(REPO / "examples" / "builtin_ppo.yaml"), *SMALL, "runner.iterations=1",
            f"runner.output_dir={tmp_path / 'elsewhere'}", "--output-dir", str(target),
        ]
    )  # fmt: skip
    assert status == 0
    assert (target / "metrics.jsonl").exists() and (target / "checkpoints").is_dir()
    assert not (tmp_path / "elsewhere").exists()
    written = load_config(target / "config.yaml")
    assert written.runner.output_dir == str(target)

    from trainer.runner.loop import run_folder

    escaping = load_config(None, ["name=../../etc/x y"])
    assert run_folder(escaping) == Path("var", "runs", "etc-x-y")


def test_resume_if_any_starts_afresh_then_continues(tmp_path, capsys):
    config = [str(REPO / "examples" / "builtin_ppo.yaml"), *SMALL]
    flags = ["--output-dir", str(tmp_path), "--resume-if-any"]
    assert run([*config, "runner.iterations=2", *flags]) == 0
    assert run([*config, "runner.iterations=3", *flags]) == 0
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [line["iteration"] for line in lines] == [1, 2, 3]


def test_sigterm_stops_after_the_iteration_with_a_checkpoint_to_resume_from(tmp_path):
    """What Ray's stop (and Ctrl-C) does to a run: it ends between iterations, saves,
    and exits 130; --resume then continues from there."""
    import signal
    import time

    command = [
        sys.executable, "-m", "trainer", "run", str(REPO / "examples" / "builtin_ppo.yaml"),
        *SMALL, "runner.iterations=100000", "runner.checkpoint_every=100000",
        "--output-dir", str(tmp_path),
    ]  # fmt: skip
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True)
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.1)
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 130, out
    assert "stopped by SIGTERM" in out
    done = len(metrics.read_text().splitlines())
    checkpoints = sorted(p.name for p in (tmp_path / "checkpoints").glob("iter_*.pt"))
    assert checkpoints == [f"iter_{done:06d}.pt"]
    config = load_config(
        REPO / "examples" / "builtin_ppo.yaml",
        [*SMALL, f"runner.output_dir={tmp_path}", f"runner.iterations={done + 1}"],
    )
    runner = OnPolicyRunner(config)
    runner.learn(resume=True)
    assert runner.iteration == done + 1


def test_a_run_writes_tensorboard_events_that_read_back_as_its_metrics(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runner = OnPolicyRunner(_config(tmp_path, "builtin_ppo.yaml", "runner.iterations=2"))
    history = runner.learn()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    scalars = events.Tags()["scalars"]
    for key in ("rollout/success_rate", "rollout/plan_success_rate_h5", "counts/episodes",
                "counts/task0/h5/successes", "losses/policy_loss"):  # fmt: skip
        assert key in scalars
        # Iterations take turns over tasks: a task's keys are there when it was trained.
        expected = [(i + 1, metrics[key]) for i, metrics in enumerate(history) if key in metrics]
        read = [(event.step, event.value) for event in events.Scalars(key)]
        assert [step for step, _ in read] == [step for step, _ in expected]
        # Event files store float32.
        assert [v for _, v in read] == pytest.approx([v for _, v in expected], rel=1e-6)
