"""Experiments: validated configs, immutable revisions, diff and clone."""

import pytest
from django.conf import settings

from controlplane.experiments import services
from controlplane.experiments.models import Revision
from trainer.config.errors import ConfigError

pytestmark = pytest.mark.django_db

CONFIG = (settings.BASE_DIR / "examples/builtin_ppo.yaml").read_text()


def test_it_creates_an_experiment_with_its_first_revision():
    experiment = services.create_experiment("e", CONFIG, tags=["a"], description="d")
    assert experiment.latest_revision.number == 1
    assert experiment.latest_revision.config_yaml == CONFIG


def test_every_change_is_a_new_revision_and_no_change_is_none():
    experiment = services.create_experiment("e", CONFIG)
    changed = CONFIG.replace("iterations: 60", "iterations: 61")
    second = services.save_revision(experiment, changed, message="longer")
    assert second.number == 2
    assert services.save_revision(experiment, changed) == second
    assert list(Revision.objects.values_list("number", flat=True)) == [2, 1]


def test_invalid_configs_name_their_key_paths_and_store_nothing():
    bad = CONFIG.replace("action_horizons_pattern: [5, 10, 15]", "action_horizons_pattern: [5, 7]")
    with pytest.raises(ConfigError) as caught:
        services.create_experiment("bad", bad)
    assert any(
        p.location.startswith("rollout.action_horizons_pattern") for p in caught.value.problems
    )
    with pytest.raises(ConfigError) as caught:
        services.create_experiment("bad", "algorithm: {name: sarsa}\n")
    assert any(p.location == "algorithm.name" for p in caught.value.problems)
    assert not Revision.objects.exists()


def test_it_diffs_and_clones():
    experiment = services.create_experiment("e", CONFIG)
    lines = services.config_diff(CONFIG, CONFIG.replace("seed: 0", "seed: 1"), "r1", "r2")
    assert "-  seed: 0" in lines and "+  seed: 1" in lines
    clone = services.clone_experiment(experiment, "e-copy")
    assert clone.latest_revision.config_yaml == CONFIG
    assert clone.latest_revision.number == 1
