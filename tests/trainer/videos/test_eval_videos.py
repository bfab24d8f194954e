"""An evaluation of a run that records videos records the first episodes of each task
and horizon, named by their cell and init state, and reports each before its table."""

from trainer.__main__ import main as trainer_main
from trainer.config.loading import load_config
from trainer.link import protocol
from trainer.link.spool import split_line
from trainer.runner.on_policy_runner import OnPolicyRunner
from trainer.videos.recorder import read_index


def test_an_evaluation_records_the_first_episodes_of_each_cell(tmp_path, monkeypatch):
    run = tmp_path / "run"
    config = load_config("examples/builtin_ppo.yaml", [
        "runner.iterations=1", "runner.progress=false", "env.num_parallel_envs=4",
        "algorithm.data_batch_size=4", "rollout.action_horizons_pattern=[5,10]",
        f"runner.output_dir={run}", "runner.videos.every=1", "runner.videos.per_task=2",
        "runner.videos.size=32",
    ])  # fmt: skip
    runner = OnPolicyRunner(config)
    runner.learn()
    runner.close()
    monkeypatch.setenv("ARMATURE_URL", "http://127.0.0.1:9")  # nobody: all is spooled
    monkeypatch.setenv("ARMATURE_RUN_ID", "7")
    monkeypatch.setenv("ARMATURE_RUN_TOKEN", "not-checked-here")
    monkeypatch.setenv("ARMATURE_SPOOL_KEY", "spool-key")
    monkeypatch.setenv("ARMATURE_LINK_FLUSH_S", "0.2")
    out = tmp_path / "eval"
    args = ["eval", str(run), "--tasks", "0,1", "--states", "3", "--output", str(out)]
    assert trainer_main(args) == 0
    index = read_index(out / "videos")
    assert sorted(row["name"] for row in index) == sorted(
        f"eval-t{task}-h{h}-s{state}" for task in (0, 1) for h in (5, 10) for state in (0, 1)
    )
    assert all(row["iteration"] == 1 and (out / "videos" / row["file"]).exists() for row in index)
    lines = (out / "link-spool" / "attempt-1.jsonl").read_bytes().splitlines()
    kinds = [protocol.parse_message(split_line(line)[1].decode()).model_dump().get("kind")
             for line in lines]  # fmt: skip
    assert kinds.count("episode") == 8
    assert max(i for i, k in enumerate(kinds) if k == "episode") < kinds.index("evaluated")
