"""A VLA's update on a tiny PaliGemma: per-token ratios by default, each action dim's
token entropy, and the KL anchor's reference sharing the frozen base with the policy."""

import json
from pathlib import Path

import pytest
import torch

from trainer.commands.tiny_vla import instructions
from trainer.config.loading import load_config
from trainer.models.vla.tiny import build_tiny_vla
from trainer.runner.checkpoints import latest_checkpoint, load_checkpoint
from trainer.runner.on_policy_runner import OnPolicyRunner

ROOT = Path(__file__).resolve().parents[3]
IMAGE = 32

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("models") / "tiny-vla"
    return build_tiny_vla(folder, instructions("builtin_reach", IMAGE), image_size=IMAGE)


def test_a_lora_vla_anchored_to_its_start_keeps_one_base_and_resumes_anchored(tiny, tmp_path):
    def config(iterations: int):
        return load_config(
            ROOT / "examples/builtin_vla.yaml",
            [f"actor.model.path={tiny}", "actor.model.build_tiny=false", f"env.image_size={IMAGE}",
             "actor.model.init_from=null", f"runner.output_dir={tmp_path}", "runner.progress=false",
             "env.num_parallel_envs=4", "algorithm.group_size=4", "algorithm.data_batch_size=16",
             "runner.torch_threads=1", "actor.model.lora.rank=4", "algorithm.kl_coef=0.1",
             f"runner.iterations={iterations}", "runner.checkpoint_every=1"],
        )  # fmt: skip

    runner = OnPolicyRunner(config(1))
    assert runner.algorithm.settings.ratio == "token"  # a vla's default
    runner.learn()
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    reported = (
        "losses/kl_reference",
        "losses/approx_kl_token",
        "losses/clip_fraction_high",
        "losses/abs_log_ratio_token",
        *(f"policy/entropy_dim{d}" for d in range(7)),
    )
    for name in reported:
        assert name in row, name
    policy, reference = runner.algorithm.policy, runner.algorithm.reference
    trained = {name for name, p in policy.named_parameters() if p.requires_grad}
    assert trained and any("lora" in name for name in trained)
    for name, param in policy.named_parameters():
        mine = reference.get_parameter(name)
        assert not mine.requires_grad
        # The frozen base is one tensor for both; what trains is the reference's own.
        assert (mine is param) == (name not in trained), name
    saved = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))["algorithm"]
    assert set(saved["reference"]) == set(saved["policy"])  # what trains, and the buffers
    moved = [n for n in trained if not torch.equal(saved["reference"][n], saved["policy"][n])]
    assert moved  # the policy left its start; the reference stayed there

    resumed = OnPolicyRunner(config(2))
    resumed.learn(resume=True)
    anchor = resumed.algorithm.reference.state_dict()
    for name, value in saved["reference"].items():
        assert torch.equal(anchor[name], value), name
