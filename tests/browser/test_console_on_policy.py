"""In Chromium: an operator takes over a robot of a running GRPO run whose policy sends
chunks of 5 actions, drives it and releases it. The operator acts per env step inside
the chunks; the run ends well, the audit has the takeover, and the run page charts the
decisions the human drove."""

import pytest
from django.conf import settings
from playwright.sync_api import expect

from controlplane.runs.models import RunEvent, RunState
from tests.browser.operator_run import (
    BROWSER_DEADMAN_S,
    charted_intervention_rates,
    effector_js,
    free_direction,
    operator_run,
    robot_state,
    values,
    wait_for_the_runs_end,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(400),
]

ITERATIONS = 15
OVERRIDES = [
    f"runner.iterations={ITERATIONS}", "env.num_parallel_envs=4", "env.task_ids=[0]",
    "algorithm.group_size=2", "algorithm.data_batch_size=4",
    "algorithm.reward_filter.enabled=false",
    "actor.model.num_action_chunks=5", "rollout.action_horizons_pattern=[5,10]",
    "env.interventions.source=console", f"env.interventions.deadman_s={BROWSER_DEADMAN_S}",
    "env.interventions.control_hz=20", "env.interventions.real_time=true",
]  # fmt: skip


def test_an_operator_drives_inside_a_grpo_runs_action_chunks(browser, stack_factory, ray_head):
    stack = stack_factory(RAY_ADDRESS=ray_head.url)
    stack.start_worker()
    stack.start_web()
    config = (settings.BASE_DIR / "examples/builtin_grpo.yaml").read_text()
    page, run = operator_run(browser, stack, "chunked-console", config, "/runs/{run}/", OVERRIDES)
    try:
        page.get_by_role("link", name="Open console").click()
        expect(page.locator("#link-state")).to_have_text("live", timeout=180_000)
        page.keyboard.press("t")
        expect(page.locator("#mode")).to_have_text("human")
        state = robot_state(page)
        axis, sign = free_direction(state)
        key = {(0, 1): "d", (0, -1): "a", (1, 1): "w", (1, -1): "s"}[axis, sign]
        page.keyboard.down(key)
        start = state["effector"][axis]
        # Moving steadily one way for 0.2 takes several env steps of the held key: more
        # than one action of a chunk.
        page.wait_for_function(
            f"() => {sign} * ({effector_js(axis)} - {start}) > 0.2", timeout=20_000
        )
        page.keyboard.up(key)
        page.keyboard.press("y")
        expect(page.locator("#mode")).to_have_text("policy")

        wait_for_the_runs_end(run, 300)
        run.refresh_from_db()
        assert run.state == RunState.SUCCEEDED, run.exit_reason
        (takeover,) = RunEvent.objects.filter(run=run, kind="takeover")
        assert takeover.data["operator"] == "olga" and takeover.data["reason"] == "released"
        # Decisions the human drove (a chunk counts once), against the env steps the
        # operator held the robot for.
        decisions = values(run, "interventions/steps")
        assert len(decisions) == ITERATIONS and sum(decisions) > 0
        assert sum(decisions) <= takeover.data["steps"]

        page.goto(f"{stack.url}/runs/{run.pk}/")
        rates = charted_intervention_rates(page, ITERATIONS)
        assert rates == pytest.approx(values(run, "interventions/rate")) and max(rates) > 0
    finally:
        page.close()
