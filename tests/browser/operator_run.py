"""A run launched by an operator, and a browser page logged in as them: where the
console's browser tests start."""

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from controlplane.experiments.services import create_experiment
from controlplane.runs.launch import launch_run
from controlplane.runs.models import Run

OPERATOR, PASSWORD = "olga", "pw-for-tests"


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
