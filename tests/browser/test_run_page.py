"""In Chromium: a run page fed by a real trainer link (the link client of trainer/link,
talking to a live daphne). The assertions read what the charts draw
(window.armatureCharts[name].data), not only what the DOM holds."""

import re
import threading
import time

import pytest
from django.conf import settings
from playwright.sync_api import expect

from controlplane.runs.models import Run, RunState
from controlplane.runs.tokens import make_run_token
from tests.processes import wait_until
from tests.runs import submitted_run
from trainer.config.loading import load_config
from trainer.link.client import TrainerLink
from trainer.link.reporter import RunReporter

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

HORIZONS = (5, 10, 15)
TASKS = (0, 1, 2)
TOTAL = 40

# What a chart draws, per line: the x values that have a y value, and those y values.
DRAWN = """name => {
  const chart = window.armatureCharts && window.armatureCharts[name];
  if (!chart || !chart.armature) return null;
  const out = {};
  for (const line of chart.armature.lines) {
    const xs = [], ys = [];
    chart.data[0].forEach((x, i) => {
      const y = chart.data[line.mean][i];
      if (y != null) { xs.push(x); ys.push(y); }
    });
    out[line.label] = {x: xs, y: ys, max: chart.data[line.max].filter(v => v != null)};
  }
  return out;
}"""


def iteration(step: int) -> dict[str, float]:
    """One iteration's metrics as the runner reports them: horizon h succeeds at a rate
    that grows with the step, one task per iteration in turn (with its counts)."""
    task = TASKS[step % len(TASKS)]
    values = {
        "rollout/success_rate": min(1.0, step / TOTAL),
        "rollout/episode_return": step * 2.0,
        "losses/policy_loss": 1.0 / step,
        "losses/value_loss": 2.0 / step,
        "losses/entropy": 1.5,
        "losses/approx_kl": 0.01,
        "losses/clip_fraction": 0.1,
        "charts/SPS": 1000.0 + step,
        "charts/iteration_seconds": 0.5,
        "charts/env_steps": 640.0 * step,
        "charts/learning_rate": 1e-3,
        f"rollout/success_rate_task_{task}": (step % 4) / 4,
    }
    for h in HORIZONS:
        values[f"rollout/plan_success_rate_h{h}"] = round(min(1.0, step * h / 600), 4)
    # The summable counts the per-task table is derived from: 4 episodes per horizon.
    won = {h: (step + h) % 5 for h in HORIZONS}  # of 4 (5 → all 4)
    won = {h: min(4, w) for h, w in won.items()}
    for h in HORIZONS:
        values[f"counts/task{task}/h{h}/episodes"] = 4.0
        values[f"counts/task{task}/h{h}/successes"] = float(won[h])
    values[f"counts/task{task}/episodes"] = 4.0 * len(HORIZONS)
    values[f"counts/task{task}/successes"] = float(sum(won.values()))
    return values


class Feeder:
    """A trainer that is nothing but its link: reports iterations when told."""

    def __init__(self, url: str, run: Run):
        self.run = run
        self.link = TrainerLink(url, run.pk, make_run_token(run.pk))
        self.step = 0
        self.link.event("started")

    def iterations(self, count: int, pause: float = 0.0) -> None:
        for _ in range(count):
            self.step += 1
            self.link.metrics(self.step, iteration(self.step))
            self.link.progress(self.step, TOTAL)
            if pause:
                time.sleep(pause)

    def settled(self) -> None:
        wait_until(lambda: self.link.pending() == 0, 30, "the link's acknowledgements")

    def finish(self) -> None:
        self.link.event("finished", {"summary": iteration(self.step)})
        self.link.close(timeout=30)  # the control plane closes a finished run's link itself
        finished = Run.objects.filter(pk=self.run.pk, state=RunState.SUCCEEDED)
        wait_until(finished.exists, 30, "the run to succeed")


def make_run(name: str) -> Run:
    return submitted_run(name)


@pytest.fixture
def page(operator_page):
    return operator_page


def drawn(page, chart: str) -> dict | None:
    return page.evaluate(DRAWN, chart)


def wait_drawn(page, chart: str, check, what: str) -> dict:
    """Poll the chart's data until `check(lines)` holds (the page redraws as points come)."""
    seen: dict = {}

    def ok() -> bool:
        nonlocal seen
        seen = drawn(page, chart) or {}
        return bool(seen) and check(seen)

    try:
        wait_until(ok, 30, what)
    except Exception as error:
        raise AssertionError(f"{what}: the chart draws {seen}") from error
    return seen


def steps_up_to(n: int) -> list[int]:
    return list(range(1, n + 1))


def test_a_streaming_run_updates_charts_tasks_and_summary(page):
    run = make_run("stream")
    feeder = Feeder(page.web.url, run)
    feeder.iterations(3)
    feeder.settled()
    page.goto(f"{page.web.url}/runs/{run.pk}/")
    expect(page.locator("[ws-connect] .live-dot.on")).to_be_visible(timeout=15_000)
    lines = wait_drawn(
        page, "success_horizon", lambda d: all(d.get(f"h{h}", {}).get("x") == [1, 2, 3]
                                                for h in HORIZONS), "the stored points",
    )  # fmt: skip
    assert list(lines) == ["h5", "h10", "h15"]  # one line per horizon of the pattern

    feeder.iterations(5)  # live, while the page is open
    lines = wait_drawn(
        page, "success_horizon", lambda d: d["h15"]["x"] == steps_up_to(8), "the pushed points"
    )
    for h in HORIZONS:
        assert lines[f"h{h}"]["y"] == [iteration(s)[f"rollout/plan_success_rate_h{h}"]
                                      for s in steps_up_to(8)]  # fmt: skip
    success = wait_drawn(page, "success", lambda d: d["success"]["x"] == steps_up_to(8), "success")
    assert success["success"]["y"][-1] == pytest.approx(8 / TOTAL)
    losses = drawn(page, "loss")
    assert losses["policy loss"]["y"] == pytest.approx([1 / s for s in steps_up_to(8)])

    summary = page.locator("#run-summary")
    expect(summary.locator('[data-field="state"]')).to_have_text("running", timeout=15_000)
    expect(summary.locator('[data-field="iteration"]')).to_have_text(f"8 / {TOTAL}", timeout=15_000)
    expect(summary.locator('[data-field="success"]')).to_have_text(
        f"{8 / TOTAL:.2f}", timeout=15_000
    )
    expect(summary.locator('[data-field="env-steps"]')).to_have_text(f"{640 * 8:,}", timeout=15_000)
    expect(summary.locator('[data-field="elapsed"]')).to_have_text(re.compile(r"^\d+:\d\d$"))
    expect(summary.locator('[data-field="eta"]')).not_to_have_text("—")

    # Per task: the table has one row per task the run trained on, with its latest rate.
    table = page.locator("#task-table")
    expect(table.locator("tbody tr")).to_have_count(len(TASKS), timeout=15_000)
    for task in TASKS:
        last = max(s for s in steps_up_to(8) if TASKS[s % len(TASKS)] == task)
        row = table.locator(f'tbody tr[data-task="{task}"]')
        expect(row.locator('td[data-column="step"]')).to_have_text(str(last), timeout=15_000)
        values = iteration(last)  # rates from the summed counts, per horizon too
        episodes = values[f"counts/task{task}/episodes"]
        expect(row.locator('td[data-column="episodes"]')).to_have_text(str(int(episodes)))
        rate = values[f"counts/task{task}/successes"] / episodes
        expect(row.locator('td[data-column="rate"]')).to_have_attribute("data-value", str(rate))
        for h in HORIZONS:
            won = values[f"counts/task{task}/h{h}/successes"] / 4
            expect(row.locator(f'td[data-column="h{h}"]')).to_have_attribute("data-value", str(won))
    expect(page.locator("#task-heatmap")).to_be_visible()
    table.get_by_role("button", name="Success", exact=True).click()  # sorts by the latest rate
    rates = [float(v) for v in table.locator('tbody td[data-column="rate"]').evaluate_all(
        "cells => cells.map(c => c.dataset.value)")]  # fmt: skip
    assert rates == sorted(rates, reverse=True)

    expect(page.locator("#run-events li[data-kind=started]")).to_have_count(1)
    expect(page.get_by_role("button", name="Stop")).to_be_visible()
    feeder.finish()  # the state changes on the page without a reload
    expect(page.locator("#run-header")).to_have_attribute("data-state", "succeeded", timeout=15_000)
    expect(page.get_by_role("button", name="Stop")).to_have_count(0)
    expect(page.locator("#run-events li[data-kind=finished]")).to_have_count(1, timeout=15_000)
    page.screenshot(path=str(page.web.log_dir / "run-page.png"), full_page=True)


def test_a_reload_mid_run_leaves_no_gap_and_no_duplicate(page):
    run = make_run("reload")
    feeder = Feeder(page.web.url, run)
    feeder.iterations(5)
    feeder.settled()
    page.goto(f"{page.web.url}/runs/{run.pk}/")
    wait_drawn(page, "success", lambda d: d["success"]["x"] == steps_up_to(5), "first points")
    streaming = threading.Thread(target=feeder.iterations, args=(30, 0.03))
    streaming.start()  # points keep coming while the page reloads, twice
    try:  # each reload lands while points are arriving: after the 10th, after the 20th
        wait_until(lambda: feeder.step >= 5 + 5, 10, "points to stream", 0.005)
        page.reload()
        wait_until(lambda: feeder.step >= 5 + 15, 10, "more points to stream", 0.005)
        page.reload()
    finally:
        streaming.join()
    feeder.settled()
    for chart, label in (("success", "success"), ("success_horizon", "h10"), ("kl", "KL")):
        lines = wait_drawn(
            page, chart, lambda d, label=label: d[label]["x"][-1:] == [35], f"{chart} to step 35"
        )
        assert lines[label]["x"] == steps_up_to(35), f"{chart} has a gap or a duplicate"
    feeder.finish()


def test_after_the_socket_drops_the_page_fetches_what_it_missed(page):
    run = make_run("reconnect")
    feeder = Feeder(page.web.url, run)
    feeder.iterations(5)
    feeder.settled()
    page.goto(f"{page.web.url}/runs/{run.pk}/")
    live = page.locator("[ws-connect] .live-dot")
    expect(live).to_have_class(re.compile(r"\bon\b"), timeout=15_000)
    wait_drawn(page, "success", lambda d: d["success"]["x"] == steps_up_to(5), "first points")
    page.web.close()  # the web server goes away: the page's socket and the link drop
    expect(live).not_to_have_class(re.compile(r"\bon\b"), timeout=15_000)
    feeder.iterations(10)  # the trainer goes on; its link keeps these until acked
    page.web.start_web()  # same address: both reconnect by themselves
    feeder.settled()
    feeder.iterations(5)  # and new points are pushed again
    expect(live).to_have_class(re.compile(r"\bon\b"), timeout=60_000)
    for chart, label in (("success", "success"), ("success_horizon", "h5")):
        lines = wait_drawn(
            page, chart, lambda d, label=label: d[label]["x"][-1:] == [20], f"{chart} to step 20"
        )
        assert lines[label]["x"] == steps_up_to(20), f"{chart} has a gap or a duplicate"
    feeder.finish()


def test_compare_overlays_two_runs_per_horizon(page):
    first, second = make_run("compare-a"), make_run("compare-b")
    for run, count in ((first, 6), (second, 4)):
        feeder = Feeder(page.web.url, run)
        feeder.iterations(count)
        feeder.finish()
    page.goto(f"{page.web.url}/runs/compare/?ids={first.pk},{second.pk}")
    # The summary: final and best success overall and per horizon, env steps.
    summary = page.locator("#compare-summary thead tr").first
    expect(summary).to_have_text(re.compile(r"Horizon 5\s*Horizon 10\s*Horizon 15"))
    for run, count in ((first, 6), (second, 4)):
        last = iteration(count)
        cells = page.locator(f'#compare-summary tr[data-run="{run.pk}"] td.num')
        expect(cells.nth(0)).to_have_text(re.compile(r"^\d+ s$"))  # wall time
        expect(cells.nth(1)).to_have_text(f"{640 * count:,}")  # env steps
        for index, key in ((2, "rollout/success_rate"), (4, "rollout/plan_success_rate_h5"),
                           (8, "rollout/plan_success_rate_h15")):  # fmt: skip
            # final, then best: the rates only grow here
            expect(cells.nth(index)).to_have_text(f"{last[key]:.2f}")
            expect(cells.nth(index + 1)).to_have_text(f"{last[key]:.2f}")
    # Each chart names a run briefly; the one legend above them names it in full.
    a, b = f"run {first.pk}", f"run {second.pk}"
    success = wait_drawn(page, "compare_success", lambda d: len(d) == 2, "two runs")
    assert success[a]["x"] == steps_up_to(6) and success[b]["x"] == steps_up_to(4)
    assert success[b]["y"] == pytest.approx([s / TOTAL for s in steps_up_to(4)])
    horizons = drawn(page, "compare_success_horizon")
    assert sorted(horizons) == sorted(f"{label} h{h}" for label in (a, b) for h in HORIZONS)
    assert horizons[f"{a} h5"]["x"] == steps_up_to(6)
    expect(page.locator("#compare-legend li")).to_have_text(
        [f"{a} · compare-a r1 succeeded", f"{b} · compare-b r1 succeeded"]
    )
    page.locator("#compare-metrics").get_by_label("Episode return").uncheck()
    expect(page.locator('figure[data-chart="compare_return"]')).to_be_hidden()
    expect(page.locator('figure[data-chart="compare_success"]')).to_be_visible()
    page.screenshot(path=str(page.web.log_dir / "compare.png"), full_page=True)

    page.goto(f"{page.web.url}/runs/compare/?ids={first.pk},424242")
    expect(page.get_by_role("alert")).to_contain_text("no such run: 424242")


def test_a_finished_run_renders_its_stored_charts(page):
    run = make_run("finished")
    feeder = Feeder(page.web.url, run)
    feeder.iterations(12)
    feeder.finish()
    assert Run.objects.get(pk=run.pk).state == RunState.SUCCEEDED
    page.goto(f"{page.web.url}/runs/{run.pk}/")
    lines = wait_drawn(
        page, "success_horizon", lambda d: d["h5"]["x"] == steps_up_to(12), "stored points"
    )
    assert lines["h15"]["y"][-1] == iteration(12)["rollout/plan_success_rate_h15"]
    throughput = drawn(page, "throughput")
    assert throughput["env steps/s"]["x"] == steps_up_to(12)
    # computed on the CPU: no GPU memory reported, no empty chart for it
    for chart in ("device", "device_allocated", "device_utilization"):
        expect(page.locator(f'figure[data-chart="{chart}"]')).to_be_hidden()
    assert throughput["iteration s"]["y"] == [0.5] * 12
    summary = page.locator("#run-summary")
    expect(summary.locator('[data-field="state"]')).to_have_text("succeeded")
    expect(summary.locator('[data-field="iteration"]')).to_have_text(f"12 / {TOTAL}")
    expect(page.get_by_role("button", name="Stop")).to_have_count(0)
    page.get_by_label("x axis").select_option("env_steps")
    wait_drawn(
        page, "success", lambda d: d["success"]["x"] == [640.0 * s for s in steps_up_to(12)],
        "env steps on the x axis",
    )  # fmt: skip
    page.get_by_label("smoothing").fill("0.9")
    smoothed = wait_drawn(
        page, "success", lambda d: d["success"]["y"][-1] < 12 / TOTAL, "the smoothed line"
    )
    assert smoothed["success"]["max"][-1] == pytest.approx(12 / TOTAL)  # the raw band stays


def rlpd_iteration(step: int) -> dict[str, float]:
    """What an RLPD run reports per iteration (trainer/runner/rlpd_runner.py)."""
    return {
        "rollout/success_rate": min(1.0, step / 10),
        "rollout/unassisted_success_rate": min(1.0, step / 20),
        "rollout/episode_return": min(1.0, step / 10),
        "rlpd/q_predicted": 0.1 * step,
        "rlpd/q_target": 0.1 * step + 0.01,
        "rlpd/critic_loss": 1.0 / step,
        "rlpd/actor_loss": -0.1 * step,
        "rlpd/temperature": 0.01 / step,
        "rlpd/entropy": 2.0 - 0.1 * step,
        "interventions/rate": 0.5 / step,
        "interventions/held_steps": 2.0 * step,
        "buffers/online": 320.0 * step,
        "buffers/demo": 41.0 + 10 * step,
        "charts/SPS": 500.0,
        "charts/update_rate": 90.0,
        "charts/env_steps": 320.0 * step,
        # a learner on a GPU (trainer/devices.py)
        "device/memory_allocated_gb": 1.0 + 0.5 * step,
        "device/memory_reserved_gb": 4.0,
        "device/memory_peak_gb": 2.0 + 0.5 * step,
        "device/utilization": 10.0 * step,
    }


def test_an_rlpd_run_charts_q_values_temperature_interventions_and_buffers(page):
    config = (settings.BASE_DIR / "examples/builtin_rlpd.yaml").read_text()
    run = submitted_run("rlpd-page", config)
    link = TrainerLink(page.web.url, run.pk, make_run_token(run.pk))
    for step in (1, 2, 3):
        link.metrics(step, rlpd_iteration(step))
    reporter = RunReporter(link, load_config(settings.BASE_DIR / "examples/builtin_rlpd.yaml"))
    reporter.on_episodes(1, [0.0, 0.5, 0.25])  # three episodes finished: more than iterations
    reporter.on_episodes(4, [1.0, 0.0, 0.0, 0.75, 0.5])
    wait_until(lambda: link.pending() == 0, 30, "the link's acknowledgements")
    page.goto(f"{page.web.url}/runs/{run.pk}/")
    expect(page.locator("[ws-connect] .live-dot.on")).to_be_visible(timeout=15_000)
    q = wait_drawn(page, "q_values", lambda d: d["predicted Q"]["x"] == [1, 2, 3], "Q values")
    assert q["target Q"]["y"] == pytest.approx([0.11, 0.21, 0.31])
    per_episode = wait_drawn(
        page, "episode_interventions",
        lambda d: d["human share of the episode"]["x"] == steps_up_to(8), "stored episodes",
    )  # fmt: skip
    assert per_episode["human share of the episode"]["y"] == [0, 0.5, 0.25, 1, 0, 0, 0.75, 0.5]
    link.metrics(4, rlpd_iteration(4))  # live
    reporter.on_episodes(9, [0.125, 0.375])
    wait_drawn(
        page, "episode_interventions",
        lambda d: d["human share of the episode"]["y"][-2:] == [0.125, 0.375], "live episodes",
    )  # fmt: skip
    buffers = wait_drawn(page, "buffers", lambda d: d["demo"]["x"] == [1, 2, 3, 4], "buffers")
    assert buffers["online"]["y"] == [320.0, 640.0, 960.0, 1280.0]
    interventions = drawn(page, "interventions")
    assert interventions["intervened steps"]["y"] == pytest.approx([0.5, 0.25, 0.5 / 3, 0.125])
    assert interventions["held still (decisions)"]["y"] == [2.0, 4.0, 6.0, 8.0]
    temperature = drawn(page, "temperature")
    assert temperature["temperature"]["y"][-1] == pytest.approx(0.0025)
    success = drawn(page, "success")
    assert success["without intervention"]["y"] == pytest.approx([0.05, 0.1, 0.15, 0.2])
    assert drawn(page, "kl") is None  # no policy-gradient charts on an off-policy run
    expect(page.locator('figure[data-chart="device"]')).to_be_visible()
    gpu = drawn(page, "device")
    assert gpu["allocated GiB"]["y"] == [1.5, 2.0, 2.5, 3.0]
    assert gpu["peak GiB"]["y"][-1] == 4.0 and gpu["utilisation %"]["y"][-1] == 40.0
    link.close(timeout=30)


def placed_devices(step: int) -> dict[str, float]:
    """Two actor ranks on GPUs, each with a rollout worker on a GPU, as rank 0 reports
    them (trainer/runner/on_policy_runner.py, gather_device_metrics); NVML only on the
    ranks' node."""
    values = {}
    for process, base in (
        ("actor-0", 10.0),
        ("actor-1", 20.0),
        ("rollout-0", 1.0),
        ("rollout-1", 2.0),
    ):
        values[f"device/{process}/memory_allocated_gb"] = base + step
        values[f"device/{process}/memory_reserved_gb"] = 2 * base
        values[f"device/{process}/memory_peak_gb"] = base + 2 * step
        if process.startswith("actor"):
            values[f"device/{process}/utilization"] = base + 5 * step
    return values


def test_a_placed_run_charts_each_processs_gpu_memory_and_utilisation(page):
    run = make_run("placed-gpus")
    feeder = Feeder(page.web.url, run)
    for _ in range(3):
        feeder.step += 1
        feeder.link.metrics(feeder.step, iteration(feeder.step) | placed_devices(feeder.step))
    feeder.settled()
    page.goto(f"{page.web.url}/runs/{run.pk}/")
    expect(page.locator("[ws-connect] .live-dot.on")).to_be_visible(timeout=15_000)
    processes = ["actor-0", "actor-1", "rollout-0", "rollout-1"]
    allocated = wait_drawn(
        page, "device_allocated", lambda d: sorted(d) == processes, "a line per process"
    )
    assert allocated["actor-1"]["y"] == [21.0, 22.0, 23.0]
    assert allocated["rollout-0"]["y"] == [2.0, 3.0, 4.0]
    assert drawn(page, "device_reserved")["rollout-1"]["y"] == [4.0] * 3
    assert drawn(page, "device_peak")["actor-0"]["y"] == [12.0, 14.0, 16.0]
    utilisation = drawn(page, "device_utilization")
    assert sorted(utilisation) == ["actor-0", "actor-1"]  # the workers reported none
    assert utilisation["actor-0"]["y"] == [15.0, 20.0, 25.0]
    expect(page.locator('figure[data-chart="device_allocated"]')).to_be_visible()
    expect(page.locator('figure[data-chart="device"]')).to_be_hidden()  # no process alone
    feeder.step += 1  # live
    feeder.link.metrics(feeder.step, iteration(feeder.step) | placed_devices(feeder.step))
    wait_drawn(page, "device_allocated", lambda d: d["actor-1"]["y"][-1:] == [24.0], "a live point")
    page.set_viewport_size({"width": 1440, "height": 900})
    page.screenshot(path=str(page.web.log_dir / "placed_gpus.png"), full_page=True)
    feeder.finish()


def diagnostics(step: int) -> dict[str, float]:
    """What a token-ratio run (a VLA's) adds per iteration (trainer/algorithms/on_policy.py,
    trainer/runner/on_policy_runner.py): why its policy moves or not."""
    values = {
        "losses/clip_fraction_low": 0.01 * step,
        "losses/clip_fraction_high": 0.02 * step,
        "losses/approx_kl_token": 0.001 * step,
        "losses/approx_kl_chunk": 0.03 * step,
        "losses/kl_reference": 0.005 * step,
        "losses/abs_log_ratio_token": 0.04 * step,
        "rollout/informative_group_share": 0.25 * (step % 4),
    }
    for dim in range(7):
        values[f"policy/entropy_dim{dim}"] = 5.0 - 0.1 * step - 0.2 * dim
    for denoising_step in range(4):  # a π0's, with a token per denoising step
        values[f"losses/approx_kl_step{denoising_step}"] = 0.001 * step * (denoising_step + 1)
        values[f"losses/clip_fraction_step{denoising_step}"] = 0.01 * step + 0.1 * denoising_step
    return values


def test_a_token_ratio_run_charts_clips_kl_log_ratios_entropy_per_dim_steps_and_groups(
    page,
):
    plain = make_run("plain")
    feeder = Feeder(page.web.url, plain)
    feeder.iterations(2)
    feeder.settled()
    page.goto(f"{page.web.url}/runs/{plain.pk}/")
    wait_drawn(page, "clip", lambda d: d["clip fraction"]["x"] == [1, 2], "the plain run")
    assert sorted(drawn(page, "clip")) == ["clip fraction"]  # no sides it never reported
    for chart in ("entropy_dims", "log_ratio", "informative_groups", "kl_steps", "clip_steps"):
        expect(page.locator(f'figure[data-chart="{chart}"]')).to_be_hidden()
    feeder.finish()

    run = make_run("token-ratio")
    feeder = Feeder(page.web.url, run)
    for _ in range(3):
        feeder.step += 1
        feeder.link.metrics(feeder.step, iteration(feeder.step) | diagnostics(feeder.step))
    feeder.settled()
    page.goto(f"{page.web.url}/runs/{run.pk}/")
    expect(page.locator("[ws-connect] .live-dot.on")).to_be_visible(timeout=15_000)
    clip = wait_drawn(page, "clip", lambda d: len(d) == 3, "both sides of the clip")
    assert clip["below 1 - low"]["y"] == pytest.approx([0.01, 0.02, 0.03])
    assert clip["above 1 + high"]["y"] == pytest.approx([0.02, 0.04, 0.06])
    kl = drawn(page, "kl")
    assert sorted(kl) == ["KL", "per chunk", "per token", "to the start policy"]
    assert kl["per token"]["y"] == pytest.approx([0.001, 0.002, 0.003])
    assert kl["to the start policy"]["y"] == pytest.approx([0.005, 0.01, 0.015])
    log_ratio = drawn(page, "log_ratio")
    assert log_ratio["|log r| per token"]["y"] == pytest.approx([0.04, 0.08, 0.12])
    entropy = drawn(page, "entropy_dims")
    assert list(entropy) == [f"dim {d}" for d in range(7)]
    assert entropy["dim 6"]["y"] == pytest.approx([3.7, 3.6, 3.5])
    informative = drawn(page, "informative_groups")
    assert informative["informative share"]["y"] == [0.25, 0.5, 0.75]
    kl_steps, clip_steps = drawn(page, "kl_steps"), drawn(page, "clip_steps")
    assert list(kl_steps) == list(clip_steps) == [f"step {k}" for k in range(4)]
    assert kl_steps["step 3"]["y"] == pytest.approx([0.004, 0.008, 0.012])
    assert clip_steps["step 1"]["y"] == pytest.approx([0.11, 0.12, 0.13])
    for chart in ("entropy_dims", "log_ratio", "informative_groups", "kl_steps", "clip_steps"):
        expect(page.locator(f'figure[data-chart="{chart}"]')).to_be_visible()
    page.screenshot(path=str(page.web.log_dir / "token-ratio.png"), full_page=True)
    feeder.finish()
