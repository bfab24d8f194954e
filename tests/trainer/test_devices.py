"""The device plumbing on a machine without a GPU: the key's resolution and errors, and a
guard proving that the rollout, the update and RLPD's learner make no tensor off the
component's device (tests/device_guard.py); tests/gpu runs the same paths on CUDA."""

from pathlib import Path

import pytest
import torch

from tests.device_guard import DeviceGuard, HostReadGuard
from trainer.algorithms.step_graph import GraphedSteps
from trainer.commands.run import run
from trainer.config import load_config
from trainer.config.errors import ConfigError
from trainer.devices import HostToDevice, describe_device, device_metrics, resolve_device
from trainer.runner.on_policy_runner import OnPolicyRunner
from trainer.runner.rlpd_runner import RLPDRunner

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[2]
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")


def _config(tmp_path, name, *overrides):
    # No episode videos: they picture the env's copies, which live on the CPU whatever
    # the device (their cost is bench/videos.py's).
    small = [
        "runner.progress=false", "runner.torch_threads=1", f"runner.output_dir={tmp_path}",
        "actor.device=cpu", "runner.videos.every=0",
    ]  # fmt: skip
    return load_config(REPO / "examples" / name, [*small, *overrides])


def test_the_guard_reports_a_factory_call_that_names_no_device():
    guard = DeviceGuard(roots=[Path(__file__)], exempt=[])
    source = torch.zeros(2)
    with guard:
        torch.zeros(3)
        torch.arange(4, device="cpu")
        source.new_zeros(5)  # follows its source
    assert len(guard.found) == 1
    assert guard.found[0].startswith("tests/trainer/test_devices.py:")


@pytest.mark.parametrize(
    ("example", "overrides"),
    [
        ("builtin_ppo.yaml", ["env.num_parallel_envs=8", "algorithm.data_batch_size=16"]),
        (
            "builtin_grpo.yaml",
            # the group filter, its resampling and the masked filler included
            ["env.num_parallel_envs=2", "algorithm.data_batch_size=16", "algorithm.group_size=4"],
        ),
    ],
)
def test_an_on_policy_iteration_makes_no_tensor_off_the_device(tmp_path, example, overrides):
    config = _config(tmp_path, example, *overrides, "algorithm.update_epochs=1")
    runner = OnPolicyRunner(config, output_dir=tmp_path)
    try:
        with DeviceGuard() as guard:
            runner.train_iteration()
            runner.state_dict()
    finally:
        runner.close()
    assert guard.found == []


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_an_rlpd_iteration_makes_no_tensor_off_the_device(tmp_path, precision):
    config = _config(
        tmp_path, "builtin_rlpd.yaml", "env.max_episode_steps=20",
        "algorithm.rlpd.training_starts=40", "algorithm.rlpd.batch_size=16",
        f"actor.precision={precision}",
    )  # fmt: skip
    runner = RLPDRunner(config, output_dir=tmp_path)
    try:
        with DeviceGuard() as guard:
            for _ in range(2):  # exploring, then acting and updating
                runner.train_iteration()
            runner.state_dict()
    finally:
        runner.close()
    assert runner.algorithm.learner.updates > 0
    assert guard.found == []


# The one read a rollout step makes on a GPU: the env's actions come back, once.
ACTIONS_BACK = {("trainer/algorithms/on_policy.py", "act")}
# Reads of what the envs give on the CPU, where they are read at no cost.
ENV_FLAGS = {("trainer/algorithms/bootstrap.py", "bootstrap_timeouts")}
PPO_SMALL = ["env.num_parallel_envs=8", "algorithm.data_batch_size=16"]
# The early stop: whether the KL allows the step is read before each step.
EARLY_STOP = ("trainer/algorithms/on_policy.py", "_minibatch_step")


@pytest.mark.parametrize("graph_tables", [False, True])
@pytest.mark.parametrize(
    ("example", "overrides", "read_per_update_step"),
    [
        ("builtin_ppo.yaml", [*PPO_SMALL, "algorithm.target_kl=null"], None),
        ("builtin_ppo.yaml", [*PPO_SMALL, "algorithm.target_kl=100"], EARLY_STOP),
        (  # the group filter's masked groups included: their rows weigh nothing
            "builtin_grpo.yaml",
            ["env.num_parallel_envs=4", "algorithm.data_batch_size=16", "algorithm.group_size=4"],
            None,
        ),
    ],
)
def test_no_step_of_the_rollout_or_the_update_reads_the_device_but_for_the_actions(
    tmp_path, example, overrides, read_per_update_step, graph_tables
):
    """What each env step and each minibatch step read back into the host, which on a
    GPU is a sync per step: the env's actions alone, and `target_kl`'s early stop.
    Decisions and statistics stay on the device until the iteration's end.
    `graph_tables`: the update's steps through the fixed tables a GPU's graphs replay
    (trainer/algorithms/step_graph.py)."""
    config = _config(tmp_path, example, *overrides, "algorithm.update_epochs=2")
    runner = OnPolicyRunner(config, output_dir=tmp_path)
    algorithm = runner.algorithm
    if graph_tables:
        algorithm.step_graphs = GraphedSteps(algorithm, capture=False)
    steps, updates = HostReadGuard(), HostReadGuard()
    try:
        # The first round works out the plan cache's schedule on the CPU, once a run.
        runner.train_iteration()
        steps_before = algorithm.optimizer_steps
        act, calls = algorithm.act, []
        algorithm.act = lambda obs: calls.append(obs) or act(obs)
        steps.around(algorithm, "act")
        steps.around(algorithm, "process_env_step")
        updates.around(algorithm, "_minibatch_step")
        runner.train_iteration()
    finally:
        runner.close()
    acted = len([read for read in steps.found if read in ACTIONS_BACK])
    assert acted == len(calls) > 0  # one read a step
    assert set(steps.found) <= ACTIONS_BACK | ENV_FLAGS
    steps_taken = algorithm.optimizer_steps - steps_before
    assert steps_taken > 0
    expected = [read_per_update_step] * steps_taken if read_per_update_step else []
    assert updates.found == expected


def test_no_rlpd_update_round_reads_the_device_and_acting_reads_its_actions_alone(tmp_path):
    config = _config(
        tmp_path, "builtin_rlpd.yaml", "env.max_episode_steps=20",
        "algorithm.rlpd.training_starts=40", "algorithm.rlpd.batch_size=16",
    )  # fmt: skip
    runner = RLPDRunner(config, output_dir=tmp_path)
    algorithm = runner.algorithm
    acting, rounds = HostReadGuard(), HostReadGuard()
    acting.around(algorithm, "act")
    rounds.around(algorithm.learner, "update")
    try:
        for _ in range(2):  # exploring, then acting and updating
            runner.train_iteration()
    finally:
        runner.close()
    assert algorithm.learner.updates > 0 and rounds.found == []
    assert set(acting.found) == {("trainer/algorithms/rlpd_algorithm.py", "act")}


def test_the_read_guard_sees_the_reads_that_sync_a_gpu():
    guard = HostReadGuard()
    values = torch.arange(3.0)
    with guard:
        values.sum().item(), values.tolist(), bool(values[0]), f"{values[1]:.1f}"
        values.cpu(), float(values[2]), values + 1
    assert len(guard.found) == 0  # this test's own reads are no trainer's

    def read(tensor):  # as if the trainer's code: each line a sync on a GPU
        tensor[tensor > 0]  # a boolean mask's rows: how many, the host must learn
        tensor.nonzero()
        tensor.repeat_interleave(tensor.long())
        tensor.repeat_interleave(tensor.long(), output_size=3)  # told: no read
        return float(tensor.sum())

    read.__code__ = read.__code__.replace(co_filename=str(REPO / "trainer" / "read.py"))
    with guard:
        read(values)
    assert guard.found == [("trainer/read.py", "read")] * 4


def test_device_keys_resolve_against_what_the_process_sees():
    assert resolve_device("cpu") == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected


@NO_GPU
@pytest.mark.parametrize("spec", ["cuda", "cuda:1"])
def test_a_gpu_the_process_does_not_see_is_a_config_error(spec):
    with pytest.raises(ConfigError) as error:
        resolve_device(spec, "actor.device")
    assert str(error.value).startswith(f"actor.device: {spec} is not there: this process sees 0")


def test_a_device_key_that_is_no_device_is_refused_by_the_schema(tmp_path):
    with pytest.raises(ConfigError) as error:
        _config(tmp_path, "builtin_ppo.yaml", "actor.device=gpu0")
    assert "actor.device" in str(error.value)


@NO_GPU
def test_the_run_command_exits_2_naming_the_device_key(tmp_path, capsys):
    status = run([str(REPO / "examples" / "builtin_ppo.yaml"), f"runner.output_dir={tmp_path}",
                  "actor.device=cuda:0", "runner.progress=false"])  # fmt: skip
    assert status == 2
    assert "actor.device: cuda:0 is not there" in capsys.readouterr().err


def test_a_cpu_process_says_so_and_reports_no_gpu_memory():
    assert describe_device(torch.device("cpu")) == "cpu"
    assert device_metrics(torch.device("cpu")) == {}


def test_host_to_device_copies_are_the_same_tensor_on_the_cpu():
    move = HostToDevice(torch.device("cpu"))
    obs = torch.randn(4, 3)
    assert move("obs", obs) is obs
