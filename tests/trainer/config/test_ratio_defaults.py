"""Which clipped ratio, clip range and KL anchor a run gets: a VLA's many action tokens
default to the per-token ratio with clip-higher, every other policy to the chunk's ratio
and the symmetric `clip_ratio`; what a config says wins."""

from pathlib import Path

import pytest

from trainer.algorithms.trust_region import ClipRange
from trainer.config import ConfigError, dump_config, load_config, parse_yaml, validate_config
from trainer.runner.build import settings_from_config

ROOT = Path(__file__).resolve().parents[3]


def test_a_vla_defaults_to_the_per_token_ratio_with_a_higher_upper_clip():
    for example in ("builtin_vla.yaml", "libero_spatial_vla.yaml", "builtin_pi0.yaml",
                    "libero_spatial_pi0.yaml"):  # fmt: skip
        config = load_config(ROOT / "examples" / example)
        algorithm = config.algorithm
        assert algorithm.ratio == "token", example
        assert (algorithm.clip_ratio_low, algorithm.clip_ratio_high) == (0.2, 0.28)
        settings = settings_from_config(config)
        assert settings.ratio == "token" and settings.clip_range() == ClipRange(0.2, 0.28)
        assert settings.kl_coef == 0.0  # no anchor, as RLinf and SimpleVLA-RL


def test_other_policies_keep_the_chunk_ratio_and_the_symmetric_clip_ratio():
    config = load_config(ROOT / "examples/builtin_grpo.yaml", ["algorithm.clip_ratio=0.1"])
    assert config.algorithm.ratio == "chunk"
    assert config.algorithm.clip_ratio_low is None and config.algorithm.clip_ratio_high is None
    assert settings_from_config(config).clip_range() == ClipRange(0.1, 0.1)
    lopsided = load_config(
        ROOT / "examples/builtin_grpo.yaml",
        ["algorithm.ratio=token", "algorithm.clip_ratio_high=0.3"],
    )
    assert settings_from_config(lopsided).clip_range() == ClipRange(0.2, 0.3)


def test_what_a_vla_config_says_wins_over_its_defaults():
    example = ROOT / "examples/builtin_vla.yaml"
    chunk = load_config(example, ["algorithm.ratio=chunk"])
    assert chunk.algorithm.ratio == "chunk"
    symmetric = load_config(example, ["algorithm.clip_ratio=0.1"])  # as configs before
    assert symmetric.algorithm.ratio == "token"
    assert settings_from_config(symmetric).clip_range() == ClipRange(0.1, 0.1)
    one_side = load_config(example, ["algorithm.clip_ratio_high=0.4"])
    assert (one_side.algorithm.clip_ratio_low, one_side.algorithm.clip_ratio_high) == (0.2, 0.4)
    anchored = load_config(example, ["algorithm.kl_coef=0.01"])
    assert settings_from_config(anchored).kl_coef == 0.01
    # The resolved config says what was used, and reads back the same.
    resolved = dump_config(one_side)
    assert validate_config(parse_yaml(resolved)) == one_side


def test_clips_and_the_kl_coefficient_are_checked():
    example = ROOT / "examples/builtin_vla.yaml"
    for override, key in (
        ("algorithm.clip_ratio_low=1", "algorithm.clip_ratio_low"),
        ("algorithm.clip_ratio_high=0", "algorithm.clip_ratio_high"),
        ("algorithm.kl_coef=-0.1", "algorithm.kl_coef"),
        ("algorithm.ratio=tokens", "algorithm.ratio"),
    ):
        with pytest.raises(ConfigError, match=key):
            load_config(example, [override])
