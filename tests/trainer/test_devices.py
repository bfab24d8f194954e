"""The device plumbing on a machine without a GPU: the key's resolution and errors, and a
guard proving that the rollout, the update and RLPD's learner make no tensor off the
component's device (tests/device_guard.py); tests/gpu runs the same paths on CUDA."""

from pathlib import Path

import pytest
import torch

from tests.device_guard import DeviceGuard
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
    small = [
        "runner.progress=false", "runner.torch_threads=1", f"runner.output_dir={tmp_path}",
        "actor.device=cpu",
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
