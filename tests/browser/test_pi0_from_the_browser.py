"""In Chromium: the seeded demo-pi0 experiment (SFT of a tiny π0) is launched and
watched to success, its model card says what the π0 is; then RL from its run folder
(examples/builtin_pi0.yaml as an experiment) is launched the same way."""

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from playwright.sync_api import expect

from controlplane.core.bootstrap import seed_demo, vla_demo_yaml
from controlplane.experiments.services import create_experiment
from controlplane.runs.artifacts import run_artifact_dir
from controlplane.runs.models import Run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(500)]


@pytest.fixture
def page(browser, stack_factory, ray_head):
    stack = stack_factory(RAY_ADDRESS=ray_head.url)
    stack.start_worker()
    stack.start_web()
    seed_demo()
    create_experiment("pi0-rl", vla_demo_yaml(settings.BASE_DIR / "examples/builtin_pi0.yaml"))
    user = get_user_model().objects.create_user("olga", password="pw-for-tests")
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    page = browser.new_page()
    page.goto(stack.url + "/login/?next=/experiments/demo-pi0/")
    page.get_by_label("Username").fill("olga")
    page.get_by_label("Password").fill("pw-for-tests")
    page.get_by_role("button", name="Log in").click()
    page.stack = stack
    yield page
    page.close()


def launch(page, experiment: str, *overrides: str) -> None:
    page.goto(f"{page.stack.url}/experiments/{experiment}/")
    page.get_by_label("Overrides").fill("\n".join(overrides))
    page.get_by_role("button", name="Launch").click()
    expect(page.get_by_role("heading", name="Run")).to_be_visible()
    expect(page.locator("#run-header")).to_have_attribute(
        "data-state", "succeeded", timeout=240_000
    )


def test_demo_pi0_trains_from_the_browser_and_rl_starts_from_its_run(page):
    small = ("env.num_parallel_envs=4", "algorithm.bc.scripted_episodes=8")
    launch(page, "demo-pi0", "runner.iterations=2", *small)
    card = page.locator("#run-model")
    expect(card.locator("tr", has_text="Family")).to_contain_text("pi0")
    expect(card.locator("tr", has_text="Actions per chunk")).to_contain_text("50")
    expect(card.locator("tr", has_text="Denoising steps")).to_contain_text("4")
    expect(card.locator("tr", has_text="Noise")).to_contain_text("sde (Flow-SDE), level 0.5")
    expect(card.locator("tr", has_text="Normalisation statistics")).to_contain_text("demos")
    expect(card.locator("tr", has_text="Base SHA-256")).to_be_visible()
    # The per-horizon success lines of the pattern [5, 10], one point per iteration.
    lines = page.wait_for_function(
        """() => {
          const chart = window.armatureCharts && window.armatureCharts.success_horizon;
          if (!chart || !chart.armature || chart.data[0].length !== 2) return null;
          return chart.armature.lines.map(l => l.label);
        }""",
        timeout=30_000,
    ).json_value()
    assert lines == ["h5", "h10"]
    sft = Run.objects.get(experiment__name="demo-pi0")

    launch(page, "pi0-rl", "runner.iterations=1", "env.num_parallel_envs=2",
           "algorithm.group_size=2", "algorithm.data_batch_size=4",
           f"actor.model.init_from={run_artifact_dir(sft.pk)}")  # fmt: skip
    expect(page.locator("#run-logs")).to_contain_text("finished 1/1 iterations", timeout=30_000)
    card = page.locator("#run-model")
    expect(card.locator("tr", has_text="Family")).to_contain_text("pi0")
