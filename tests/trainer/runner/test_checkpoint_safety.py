"""A checkpoint is read as tensors and plain data: a planted pickle in a run folder is
refused, with a message that names the file, wherever a checkpoint is read (resume,
`actor.model.init_from`, `trainer eval`, a folder of shards)."""

import os
import pickle
from pathlib import Path

import pytest
import torch
from torch import nn

from trainer.__main__ import main as trainer_main
from trainer.algorithms.sharding import load_shards, save_shards
from trainer.commands.run import run
from trainer.runner.checkpoints import UnreadableCheckpoint, load_checkpoint, save_checkpoint

REPO = Path(__file__).resolve().parents[3]
SMALL = [
    "env.num_parallel_envs=4", "algorithm.data_batch_size=8", "runner.progress=false",
    "algorithm.update_epochs=1", "algorithm.num_minibatches=2", "runner.torch_threads=1",
]  # fmt: skip


class Planted:
    """What an attacker's pickle holds: unpickling it runs a command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def plant(path: Path, marker: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"iteration": 9, "algorithm": {"policy": Planted(marker)}}, path)
    return path


def test_a_planted_pickle_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "ran"
    path = plant(tmp_path / "iter_000009.pt", marker)
    with pytest.raises(UnreadableCheckpoint, match=r"iter_000009\.pt holds objects other than "
                       r"tensors and plain data \(posix\.system\)"):  # fmt: skip
        load_checkpoint(path)
    assert not marker.exists()


def test_what_is_no_checkpoint_is_named(tmp_path):
    text = tmp_path / "iter_000001.pt"
    text.write_text("not a checkpoint")
    with pytest.raises(UnreadableCheckpoint, match="iter_000001.pt is not a readable checkpoint"):
        load_checkpoint(text)
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(UnreadableCheckpoint, match="holds no state dict"):
        load_checkpoint(tmp_path / "list.pt")


@pytest.mark.parametrize("name", ["../elsewhere.shards", "/tmp/x.shards", "..", ""])
def test_shards_are_read_only_from_beside_the_checkpoint(tmp_path, name):
    path = save_checkpoint(tmp_path, 1, {"iteration": 1, "algorithm": {"shards": name}})
    with pytest.raises(UnreadableCheckpoint, match="not a folder beside it"):
        load_checkpoint(path)


def test_every_example_checkpoint_reads_back(tmp_path):
    """What the runs write is tensors and plain data (RNG states included)."""
    for example in ("builtin_ppo.yaml", "builtin_rlpd.yaml"):
        out = tmp_path / example
        args = [str(REPO / "examples" / example), *SMALL, "runner.iterations=1"]
        assert run([*args, f"runner.output_dir={out}"]) == 0
        state = load_checkpoint(out / "checkpoints" / "iter_000001.pt")
        assert state["iteration"] == 1


def test_resume_init_from_and_eval_refuse_a_planted_checkpoint(tmp_path, capsys):
    marker = tmp_path / "ran"
    run_dir = tmp_path / "victim"
    plant(run_dir / "checkpoints" / "iter_000009.pt", marker)
    example = str(REPO / "examples" / "builtin_ppo.yaml")

    assert run([example, *SMALL, f"runner.output_dir={run_dir}", "--resume"]) == 2
    assert "cannot resume:" in capsys.readouterr().err

    out = tmp_path / "started"
    assert run([example, *SMALL, f"actor.model.init_from={run_dir}",
                f"runner.output_dir={out}"]) == 2  # fmt: skip
    assert "actor.model.init_from:" in capsys.readouterr().err

    assert trainer_main(["eval", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "cannot evaluate:" in err and "holds objects other than tensors" in err
    assert not marker.exists()


def test_shards_load_as_written_and_planted_metadata_is_refused(tmp_path):
    torch.manual_seed(0)
    model = nn.Linear(3, 4)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 3)).sum().backward()
    optimizer.step()
    folder = tmp_path / "iter_000001.shards"
    save_shards(model, optimizer, folder)

    restored = nn.Linear(3, 4)
    restored_optimizer = torch.optim.Adam(restored.parameters())
    load_shards(restored, restored_optimizer, folder)
    assert torch.equal(restored.weight, model.weight)
    moments = [opt.state_dict()["state"][0]["exp_avg"] for opt in (optimizer, restored_optimizer)]
    assert torch.equal(*moments)

    marker = tmp_path / "ran"
    with (folder / ".metadata").open("wb") as file:
        pickle.dump(Planted(marker), file)
    with pytest.raises(UnreadableCheckpoint, match="metadata names posix.system: refused"):
        load_shards(restored, restored_optimizer, folder)
    assert not marker.exists()
