"""In Chromium: a run's page charts what the run logged. An SFT run's behaviour-cloning
loss has a panel and PPO's losses none; "All metrics" charts any logged key, grouped by
prefix and found by search, live; compare offers the same keys, a line per run. And the
run's one success figure reads the same on its page, Home, the runs list and the API."""

import re

import pytest
from django.conf import settings
from playwright.sync_api import expect

from controlplane.runs.models import RunState
from controlplane.runs.state import transition
from tests.browser.test_run_page import Feeder, wait_drawn
from tests.runs import submitted_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]


@pytest.fixture
def page(operator_page):
    return operator_page


SFT = (settings.BASE_DIR / "examples/builtin_vla_sft.yaml").read_text()
PPO_PANELS = ("loss", "entropy", "kl", "clip")


def sft_iteration(step: int) -> dict[str, float]:
    return {
        "bc/loss": 4.0 / step,
        "bc/nll_per_action_dim": 4.0 / step / 7,
        "bc/demo_rows": 1280.0,
        "rollout/success_rate": step / 10,
        "rollout/episode_return": float(step),
        "charts/env_steps": 640.0 * step,
    }


def feed(feeder: Feeder, count: int) -> None:
    for _ in range(count):
        feeder.step += 1
        feeder.link.metrics(feeder.step, sft_iteration(feeder.step))
        feeder.link.progress(feeder.step, 20)
    feeder.settled()


def test_an_sft_run_charts_its_loss_and_all_metrics_finds_any_key_live(page):
    run = submitted_run("vla-sft", SFT)
    feeder = Feeder(page.web.url, run)
    feed(feeder, 3)
    page.goto(f"{page.web.url}/runs/{run.pk}/")
    expect(page.locator("[ws-connect] .live-dot.on")).to_be_visible(timeout=15_000)
    bc = wait_drawn(page, "bc_loss", lambda d: d["loss"]["x"] == [1, 2, 3], "the BC loss")
    assert bc["loss"]["y"] == pytest.approx([4.0, 2.0, 4 / 3])
    assert bc["NLL per action dim"]["y"] == pytest.approx([4 / 7, 2 / 7, 4 / 21])
    expect(page.locator('figure[data-chart="bc_loss"]')).to_be_visible()
    # Three iterations: the x axis ticks at whole iterations only (uPlot's tick labels).
    ticks = page.evaluate("armatureCharts.bc_loss.axes[0]._values")
    assert ticks and all(re.fullmatch(r"\d+", tick) for tick in ticks), ticks
    for panel in PPO_PANELS:  # logged nothing: not drawn, no empty "—" legends
        expect(page.locator(f'figure[data-chart="{panel}"]')).to_be_hidden()
    expect(page.locator("#charts-empty")).to_be_hidden()

    browser_box = page.locator("#all-metrics")
    expect(browser_box.locator("[data-count]")).to_have_text("6 keys")
    expect(browser_box.locator("summary")).to_have_text(["bc (3)", "charts (1)", "rollout (2)"])
    browser_box.get_by_label("search metrics").fill("nll")
    expect(browser_box.locator("[data-count]")).to_have_text("1 of 6 keys match")
    nll = wait_drawn(page, "all:bc/nll_per_action_dim", lambda d: len(d) == 1, "the nll chart")
    (line,) = nll.values()
    assert line["x"] == [1, 2, 3] and line["y"] == pytest.approx([4 / 7, 2 / 7, 4 / 21])
    expect(browser_box.locator('figure[data-key="bc/nll_per_action_dim"]')).to_be_visible()
    expect(browser_box.locator('figure[data-key="bc/loss"]')).to_be_hidden()
    expect(browser_box.locator('details[data-group="rollout"]')).to_be_hidden()

    feed(feeder, 2)  # live: the open chart takes the pushed points
    five = lambda d: next(iter(d.values()))["x"] == [1, 2, 3, 4, 5]  # noqa: E731
    wait_drawn(page, "all:bc/nll_per_action_dim", five, "the pushed points")
    feeder.link.metrics(6, {**sft_iteration(6), "custom/grad_norm": 0.5})  # a new prefix
    feeder.settled()
    browser_box.get_by_label("search metrics").fill("grad")
    grad = wait_drawn(page, "all:custom/grad_norm", lambda d: len(d) == 1, "a new key")
    assert next(iter(grad.values()))["y"] == [0.5]
    page.screenshot(path=str(page.web.log_dir / "all-metrics.png"), full_page=True)
    feeder.finish()


def test_compare_offers_every_logged_key_a_line_per_run(page):
    runs = [submitted_run(name, SFT) for name in ("sft-a", "sft-b")]
    for run, count in zip(runs, (4, 2), strict=True):
        feeder = Feeder(page.web.url, run)
        feed(feeder, count)
        feeder.finish()
    page.goto(f"{page.web.url}/runs/compare/?ids={runs[0].pk},{runs[1].pk}")
    box = page.locator("#all-metrics")
    box.get_by_label("search metrics").fill("bc/loss")
    loss = wait_drawn(page, "all:bc/loss", lambda d: len(d) == 2, "both runs' lines")
    assert loss[f"run {runs[0].pk}"]["x"] == [1, 2, 3, 4]  # named in full once, above
    assert loss[f"run {runs[1].pk}"]["y"] == pytest.approx([4.0, 2.0])


def test_a_stopped_runs_success_reads_the_same_everywhere(page):
    run = submitted_run("stopped-midway")
    feeder = Feeder(page.web.url, run)
    for step, rate in ((1, 0.0), (2, 0.125), (3, 0.25)):
        feeder.step = step
        feeder.link.metrics(step, {"rollout/success_rate": rate, "charts/env_steps": 64.0 * step})
    feeder.settled()
    transition(run.pk, RunState.CANCELLED, "stopped by rita")  # mid-way: no final summary
    feeder.link.close(timeout=30)

    api = page.request.get(f"{page.web.url}/api/v1/runs/{run.pk}").json()
    assert api["latest_success"] == 0.25
    listed = page.request.get(f"{page.web.url}/api/v1/runs?experiment=stopped-midway").json()
    assert [r["latest_success"] for r in listed["results"]] == [0.25]
    page.goto(f"{page.web.url}/runs/{run.pk}/")
    expect(page.locator('#run-summary [data-field="success"]')).to_have_text("0.25")
    page.goto(f"{page.web.url}/")
    expect(page.locator(f"#run-row-{run.pk} td.success")).to_have_text("0.25")
    page.goto(f"{page.web.url}/runs/")
    expect(page.locator(f"#run-row-{run.pk} td.success")).to_have_text("0.25")
