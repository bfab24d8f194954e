"""A run launched by an operator, and a browser page logged in as them: where the
console's browser tests start; and what they read of the run and of the page."""

import math
import subprocess

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from controlplane.experiments.services import create_experiment
from controlplane.runs.launch import launch_run
from controlplane.runs.models import MetricPoint, Run
from tests.processes import wait_until

OPERATOR, PASSWORD = "olga", "pw-for-tests"
# The console's browser tests are about the operator's path, not the deadman (tested in
# tests/controlplane/console/test_console_safety.py): a headless browser on a 2-core CI
# machine running the suite's stages side by side has missed its 25 ms heartbeats for
# longer than 1 s, so these runs give a silent operator 5 s, not the default 0.15 s.
BROWSER_DEADMAN_S = 5.0


def operator_run(browser, stack, name: str, config: str, next_path: str, overrides=()):
    """Launch an experiment of `config` as the operator and log them in on a new page,
    which goes on to `next_path` (formatted with the run's id as `run`). No gamepad is
    plugged in: the page's Gamepad API lists `window.testPads`."""
    experiment = create_experiment(name, config)
    user = get_user_model().objects.create_user(OPERATOR, password=PASSWORD)
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    run, _ = launch_run(experiment, user=user, overrides=list(overrides))
    page = browser.new_page()
    page.add_init_script("window.testPads = []; navigator.getGamepads = () => window.testPads;")
    page.goto(f"{stack.url}/login/?next={next_path.format(run=run.pk)}")
    page.get_by_label("Username").fill(OPERATOR)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    return page, Run.objects.get(pk=run.pk)


def values(run: Run, key: str) -> list[float]:
    points = MetricPoint.objects.filter(key__run=run, key__name=key).order_by("step")
    return list(points.values_list("value", flat=True))


def effector_js(axis: int) -> str:
    """The effector's coordinate on the page: "effector x y z · gripper g · goal x y z"."""
    return f"Number(document.getElementById('robot-state').textContent.split(' ')[{axis + 1}])"


def robot_state(page) -> dict[str, list[float]]:
    """The robot's state as the page shows it, once the env has placed its goal (the
    markers are never at the origin). Up to 2 minutes: on a loaded machine the env's
    first reset after the run starts may come long after the console went live."""
    try:
        page.wait_for_function(
            f"""() => !Number.isNaN({effector_js(0)}) && !document.getElementById(
                      'robot-state').textContent.includes('goal 0 0 0')""",
            timeout=120_000,
        )
    except PlaywrightTimeout:
        keys = ("robot-state", "link-state", "mode", "episode-step", "fps")
        shown = {key: page.locator(f"#{key}").text_content() for key in keys}
        raise AssertionError(f"the robot's state never showed a placed goal: {shown}") from None
    text = page.locator("#robot-state").text_content()
    parts = (part.split() for part in text.split(" · "))
    return {name: [float(v) for v in rest] for name, *rest in parts}


def free_direction(state: dict[str, list[float]]) -> tuple[int, int]:
    """An axis (x or y) and a sign to drive the held effector 0.2 along and see it get
    there: with room before the workspace's wall at ±1, and not into the goal (reaching
    it would end the episode and put the effector back at its start)."""
    effector, goal = state["effector"], state["goal"]
    for axis in (0, 1):
        others = [i for i in range(3) if i != axis]
        aside = math.dist([effector[i] for i in others], [goal[i] for i in others])
        for sign in (1, -1):
            away = sign * (goal[axis] - effector[axis]) < 0
            if 1 - sign * effector[axis] > 0.4 and (away or aside > 0.3):
                return axis, sign
    raise AssertionError(f"no free direction from {state}")


def charted_intervention_rates(page, iterations: int) -> list[float]:
    """The run page's intervention-rate chart (the mean line), once it has a point for
    each of `iterations`."""
    return page.wait_for_function(
        """(iterations) => {
          const chart = window.armatureCharts && window.armatureCharts.interventions;
          if (!chart || !chart.armature || chart.data[0].length !== iterations) return null;
          return chart.data[chart.armature.lines[0].mean];
        }""",
        arg=iterations,
        timeout=30_000,
    ).json_value()


def wait_for_the_runs_end(run: Run, timeout_s: float) -> Run:
    """The run, once final; past `timeout_s`, a failure that says how far it got (its
    state, progress, last events and metric step, and its trainer's processes), so a
    run that is slow can be told from one that is stuck."""
    try:
        wait_until(lambda: Run.objects.get(pk=run.pk).is_final, timeout_s, "the run's end", 0.5)
    except TimeoutError:
        run.refresh_from_db()
        events = [f"{e.created_at:%H:%M:%S} {e.kind} {e.message or ''} {str(e.data)[:200]}"
                  for e in run.events.order_by("-pk")[:12]][::-1]  # fmt: skip
        last = MetricPoint.objects.filter(key__run=run).order_by("-step").first()
        processes = subprocess.run(["ps", "-eo", "pid,stat,pcpu,etimes,args"], text=True,
                                   capture_output=True).stdout.splitlines()  # fmt: skip
        trainers = [line[:220] for line in processes if "trainer" in line]
        raise TimeoutError("\n".join([
            f"run {run.pk} not final after {timeout_s:.0f} s: {run.state}, progress "
            f"{run.progress_step}/{run.progress_total}, last metric step "
            f"{last.step if last else None} at {last.wall_time if last else None}",
            *events, "trainer processes:", *trainers,
        ])) from None  # fmt: skip
    return Run.objects.get(pk=run.pk)
