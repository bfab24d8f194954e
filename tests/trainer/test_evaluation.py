"""`python -m trainer eval`: every task × every fixed init state exactly once per
horizon, deterministic (the same table twice), written as JSON and Markdown with the
suite average; bad input gets a clear message; launched by the control plane, it
reports over the link what the control plane's schema accepts."""

import json
import os
from pathlib import Path

import pytest
import torch

from trainer.__main__ import main as trainer_main
from trainer.config.env_defaults import BUILTIN_TASK_COUNT, env_task_count
from trainer.config.loading import load_config
from trainer.envs import BuiltinReachEnv
from trainer.envs.builtin_reach import TASK_NAMES
from trainer.evaluation.protocol import evaluate
from trainer.link import protocol
from trainer.link.spool import split_line
from trainer.models import GaussianChunkPolicy, build_encoder
from trainer.runner.on_policy_runner import OnPolicyRunner

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "builtin_ppo.yaml"


class Recording(BuiltinReachEnv):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.starts = []

    def reset(self, task_id, init_states):
        self.starts.append((task_id, init_states.clone()))
        return super().reset(task_id, init_states)


def test_every_state_of_every_task_runs_once_per_horizon():
    torch.manual_seed(0)
    env = Recording(num_envs=4, max_episode_steps=10, init_states_per_task=6)
    policy = GaussianChunkPolicy(build_encoder("mlp", env.obs_shape, (16,)), 7, 7, 10)
    results = evaluate(policy, env, [0, 2], horizons=[5, 10], chunk=5)
    assert [(r.task_id, r.episodes) for r in results] == [(0, 12), (2, 12)]
    assert all(sorted(r.per_horizon) == [5, 10] for r in results)
    assert all(r.per_horizon[5][1] == 6 for r in results)
    # 6 states in batches of 4: [0..3], then [4, 5] padded with 5s (ignored).
    for task in (0, 2):
        states = env.init_states(task)
        runs = [s for t, s in env.starts if t == task]
        assert len(runs) == 4
        torch.testing.assert_close(runs[0], states[:4])
        torch.testing.assert_close(runs[1], states[[4, 5, 5, 5]])


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A run folder with the checkpoint of a 2-iteration run (pattern [5, 10])."""
    folder = tmp_path_factory.mktemp("trained")
    config = load_config(EXAMPLE, [
        "runner.iterations=2", "runner.progress=false", "env.num_parallel_envs=4",
        "algorithm.data_batch_size=4", "rollout.action_horizons_pattern=[5,10]",
        f"runner.output_dir={folder}", "runner.videos.every=0",
    ])  # fmt: skip
    runner = OnPolicyRunner(config)
    runner.learn()
    runner.close()
    return folder


def test_the_cli_writes_a_deterministic_table_of_a_trained_run(trained, tmp_path):
    args = ["eval", str(trained), "--tasks", "0,1", "--states", "5", "--output"]
    assert trainer_main([*args, str(tmp_path / "a")]) == 0
    assert trainer_main([*args, str(tmp_path / "b")]) == 0
    first = json.loads((tmp_path / "a" / "eval-builtin_reach-iter2.json").read_text())
    second = json.loads((tmp_path / "b" / "eval-builtin_reach-iter2.json").read_text())
    assert first == {**second, "checkpoint": first["checkpoint"]}
    assert [t["task_id"] for t in first["tasks"]] == [0, 1]
    assert [t["episodes"] for t in first["tasks"]] == [10, 10]
    assert first["horizons"] == [5, 10] and set(first["horizon_average"]) == {"5", "10"}
    rates = [t["rate"] for t in first["tasks"]]
    assert first["average"] == pytest.approx(sum(rates) / 2)
    table = (tmp_path / "a" / "eval-builtin_reach-iter2.md").read_text()
    assert "| task | name | success | episodes | H=5 | H=10 |" in table
    assert "**average**" in table


def test_bad_input_is_named(tmp_path, capsys):
    assert trainer_main(["eval", str(tmp_path)]) == 2
    assert "no checkpoint at" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--tasks", "9,1,7"], "--tasks: builtin_reach has tasks 0..5, not 9, 7"),
        (["--tasks", "a,-1"], "--tasks: not task ids: a, -1"),
        (["--tasks", "1,1"], "--tasks: listed twice: 1"),
        (["--states", "0"], "--states: must be at least 1, not 0"),
        (["--suite", "libero_goal"], "--suite: builtin_reach has no suites"),
    ],
)
def test_bad_tasks_states_and_suites_are_named(trained, tmp_path, capsys, flags, message):
    assert trainer_main(["eval", str(trained), "--output", str(tmp_path), *flags]) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.glob("eval-*"))


def spooled(folder: Path) -> list[dict]:
    """The messages a link left in the run folder's spool, read with the control
    plane's own validation."""
    lines = (folder / "link-spool" / "attempt-1.jsonl").read_bytes().splitlines()
    payloads = [split_line(line)[1].decode() for line in lines]  # each `<mac> <payload>`
    return [protocol.parse_message(payload).model_dump() for payload in payloads]


@pytest.fixture
def unreachable_control_plane(monkeypatch):
    """The link variables of a launched run, with nobody listening: every message stays
    in the spool, where the control plane would ingest it."""
    monkeypatch.setenv("ARMATURE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("ARMATURE_RUN_ID", "7")
    monkeypatch.setenv("ARMATURE_RUN_TOKEN", "not-checked-here")
    monkeypatch.setenv("ARMATURE_SPOOL_KEY", "spool-key-of-the-attempt")
    monkeypatch.setenv("ARMATURE_LINK_FLUSH_S", "0.2")


def test_a_launched_evaluation_reports_progress_per_task_the_table_and_finished(
    trained, tmp_path, unreachable_control_plane
):
    checkpoint = trained / "checkpoints" / "iter_000002.pt"
    args = ["eval", str(checkpoint), "--tasks", "3,0,5", "--states", "3", "--output"]
    assert trainer_main([*args, str(tmp_path)]) == 0
    messages = spooled(tmp_path)
    kinds = [m.get("kind", m["type"]) for m in messages]
    assert kinds == ["started", "placed", "progress", "progress", "progress", "progress",
                     "evaluated", "finished"]  # fmt: skip
    started = messages[0]["data"]
    assert started["mode"] == "eval" and started["iteration"] == 2
    assert started["checkpoint"] == str(checkpoint) and started["tasks"] == [3, 0, 5]
    assert messages[1]["data"]["processes"][0]["pid"] == os.getpid()
    assert [(m["step"], m["total"]) for m in messages[2:6]] == [(0, 3), (1, 3), (2, 3), (3, 3)]
    table = json.loads((tmp_path / "eval-builtin_reach-iter2.json").read_text())
    assert messages[6]["data"] == table
    assert [t["task_id"] for t in table["tasks"]] == [3, 0, 5]
    assert all(t["episodes"] == 6 for t in table["tasks"])  # 3 states x 2 horizons
    summary = messages[7]["data"]["summary"]
    assert summary["eval/success_rate"] == table["average"]
    assert summary["eval/success_rate_h10"] == table["horizon_average"]["10"]
    assert summary["eval/success_rate_task_5"] == table["tasks"][2]["rate"]
    assert summary["eval/episodes"] == 18


def test_a_launched_evaluation_refused_its_input_reports_failed(
    trained, tmp_path, unreachable_control_plane
):
    args = ["eval", str(trained), "--tasks", "0,6", "--output", str(tmp_path)]
    assert trainer_main(args) == 2
    failed = spooled(tmp_path)[-1]
    assert failed["kind"] == "failed"
    assert "--tasks: builtin_reach has tasks 0..5, not 6" in failed["data"]["error"]


def test_the_task_counts_the_control_plane_checks_are_the_envs_own():
    assert BUILTIN_TASK_COUNT == len(TASK_NAMES) == BuiltinReachEnv(num_envs=1).num_tasks
    assert env_task_count("builtin_reach", None) == BUILTIN_TASK_COUNT
    assert env_task_count("libero", None) == 10 and env_task_count("libero", "libero_90") == 90
    assert env_task_count("some_plugin_env", None) is None


def test_an_rlpd_checkpoint_is_evaluated_as_its_deterministic_actor(tmp_path):
    from tests.policy_alone import success_alone
    from trainer.config.loading import load_config
    from trainer.runner.rlpd_runner import RLPDRunner

    config = load_config(
        "examples/builtin_rlpd.yaml",
        ["runner.iterations=6", "runner.progress=false", f"runner.output_dir={tmp_path}"],
    )  # fmt: skip
    runner = RLPDRunner(config)
    runner.learn()
    try:  # the run's own check: its first 8 init states, the operator off
        own = success_alone(runner)
    finally:
        runner.close()
    args = ["eval", str(tmp_path), "--states", "8", "--output", str(tmp_path / "eval")]
    assert trainer_main(args) == 0
    table = json.loads(next((tmp_path / "eval").glob("eval-builtin_reach-iter6.json")).read_text())
    (task,) = table["tasks"]
    assert task["task_id"] == 0 and task["episodes"] == 8
    assert list(task["per_horizon"]) == ["1"] and task["per_horizon"]["1"]["episodes"] == 8
    assert task["successes"] / 8 == own  # the same states, the same deterministic actions


def frozen_config_of(run_folder: Path, tmp_path: Path, **changes) -> Path:
    """The run's config as the control plane froze it (what its job folder holds), with
    `changes` at dotted key paths."""
    state = torch.load(sorted((run_folder / "checkpoints").glob("iter_*.pt"))[-1],
                       weights_only=True)  # fmt: skip
    data = json.loads(json.dumps(state["config"]))
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = data
        for key in parents:
            node = node[key]
        node[last] = value
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(data))  # JSON is YAML
    return path


def test_with_the_frozen_config_the_evaluation_runs_it_not_the_checkpoints(trained, tmp_path):
    """What is evaluated is the frozen config's: here fewer init states per task."""
    frozen = frozen_config_of(trained, tmp_path, **{"env.init_states_per_task": 3})
    args = ["eval", str(trained), "--config", str(frozen), "--tasks", "0", "--output"]
    assert trainer_main([*args, str(tmp_path / "out")]) == 0
    table = json.loads((tmp_path / "out" / "eval-builtin_reach-iter2.json").read_text())
    assert [t["episodes"] for t in table["tasks"]] == [6]  # 3 states x 2 horizons


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("env.name", "real_robot"),
        ("actor.model.path", "/elsewhere/model"),
        ("cluster", {"num_nodes": 1, "node_groups": [{"label": "cpu", "node_ranks": 0}]}),
    ],
)
def test_a_checkpoint_whose_config_disagrees_with_the_frozen_one_is_refused(
    trained, tmp_path, capsys, key, value
):
    frozen = frozen_config_of(trained, tmp_path, **{key: value})
    args = ["eval", str(trained), "--config", str(frozen), "--output", str(tmp_path / "out")]
    assert trainer_main(args) == 2
    error = capsys.readouterr().err
    assert f"{key}: the checkpoint's own config says otherwise than the run's frozen" in error
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("eval-*.json"))
