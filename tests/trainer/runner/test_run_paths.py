"""Where a run reads and writes, when the control plane launched it: a new run's
`--output-dir` holds nothing (a folder planted ahead of the run, with a checkpoint in
it, is refused, not resumed from); every file its config names lies inside the roots
the control plane gives (ARMATURE_PATH_ROOTS); and a run config it starts from
(`actor.model.init_from: x.yaml`) trains inside the launching run's folder."""

from pathlib import Path

import torch
import yaml

from trainer.commands.run import run
from trainer.config.path_roots import ROOTS_ENV

REPO = Path(__file__).resolve().parents[3]
SMALL = ["env.num_parallel_envs=4", "algorithm.data_batch_size=8", "runner.progress=false",
         "algorithm.update_epochs=1", "algorithm.num_minibatches=2", "runner.torch_threads=1",
         "runner.iterations=1"]  # fmt: skip
PPO = str(REPO / "examples" / "builtin_ppo.yaml")


def test_a_new_run_refuses_an_output_folder_that_already_holds_a_checkpoint(tmp_path, capsys):
    planted = tmp_path / "run-8"
    (planted / "checkpoints").mkdir(parents=True)
    torch.save({"iteration": 999_999}, planted / "checkpoints" / "iter_999999.pt")
    assert run([PPO, *SMALL, "--output-dir", str(planted)]) == 2
    assert f"--output-dir: {planted} already holds files" in capsys.readouterr().err
    assert not (planted / "metrics.jsonl").exists()
    fresh = tmp_path / "run-9"
    fresh.mkdir(mode=0o700)  # as the control plane makes it
    assert run([PPO, *SMALL, "--output-dir", str(fresh)]) == 0
    assert (fresh / "metrics.jsonl").exists()


def test_with_roots_a_file_outside_them_or_a_relative_one_is_refused(tmp_path, monkeypatch, capsys):
    inside, elsewhere = tmp_path / "models", tmp_path / "elsewhere"
    inside.mkdir()
    elsewhere.mkdir()
    (inside / "link").symlink_to(elsewhere)  # inside by name only
    (elsewhere / "sft.yaml").write_text(Path(PPO).read_text())  # any YAML on the node
    monkeypatch.setenv(ROOTS_ENV, f"{tmp_path / 'artifacts'}:{inside}")
    for where, shown in [
        (str(elsewhere / "sft.yaml"), "resolves outside the folders"),
        (str(inside / "link" / "sft.yaml"), "resolves outside the folders"),
        ("examples/builtin_ppo.yaml", "is relative"),
    ]:
        output = tmp_path / "out" / str(len(capsys.readouterr().err))
        assert run([PPO, *SMALL, f"actor.model.init_from={where}",
                    "--output-dir", str(output)]) == 2  # fmt: skip
        assert shown in capsys.readouterr().err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.pt"))


def test_a_run_config_started_from_trains_inside_the_launching_runs_folder(
    tmp_path, monkeypatch, capsys
):
    roots = tmp_path / "artifacts"
    start = roots / "shared" / "start.yaml"
    start.parent.mkdir(parents=True)
    # Its own output folder is outside every root: it must never be written.
    document = yaml.safe_load(Path(PPO).read_text())
    document["env"]["num_parallel_envs"] = 4
    document["algorithm"].update(data_batch_size=8, update_epochs=1, num_minibatches=2)
    document["runner"].update(iterations=1, progress=False, torch_threads=1,
                              output_dir=str(tmp_path / "its-own"))  # fmt: skip
    start.write_text(yaml.safe_dump(document))
    monkeypatch.setenv(ROOTS_ENV, str(roots))
    folder = roots / "run-3"
    folder.mkdir(mode=0o700)
    overrides = [*SMALL, f"actor.model.init_from={start}"]
    assert run([PPO, *overrides, "--output-dir", str(folder)]) == 0, capsys.readouterr().err
    assert "training the run it starts from first" in capsys.readouterr().out
    assert any((folder / "start" / "checkpoints").glob("iter_*.pt"))
    assert not (tmp_path / "its-own").exists()


def test_a_run_config_started_from_is_not_echoed_into_the_runs_events(
    tmp_path, monkeypatch, capsys
):
    roots = tmp_path / "artifacts"
    secret = roots / "notes.yaml"
    roots.mkdir()
    secret.write_text("password: hunter2\nenv: {name: nowhere}\n")
    monkeypatch.setenv(ROOTS_ENV, str(roots))
    output = roots / "run-4"
    assert run([PPO, *SMALL, f"actor.model.init_from={secret}", "--output-dir",
                str(output)]) == 2  # fmt: skip
    error = capsys.readouterr().err
    assert "actor.model.init_from" in error and "problem(s)" in error
    assert "hunter2" not in error and "password" not in error and "nowhere" not in error
