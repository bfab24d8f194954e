"""Runs for tests, made the way the app stores them: an experiment of the built-in PPO
example and a run of its latest revision, queued as a launch leaves it or already
submitting, as a trainer meets it."""

from django.conf import settings

from controlplane.experiments.models import Experiment
from controlplane.experiments.services import create_experiment
from controlplane.runs import metric_points
from controlplane.runs.models import MetricKey, Run, RunState
from controlplane.runs.state import transition

CONFIG = (settings.BASE_DIR / "examples/builtin_ppo.yaml").read_text()


def queued_run(experiment: str | Experiment, config: str = CONFIG) -> Run:
    """A queued run of `experiment` (created with `config` when named)."""
    if isinstance(experiment, str):
        experiment = create_experiment(experiment, config)
    return Run.objects.create(
        experiment=experiment, revision=experiment.latest_revision, config_yaml=config
    )


def submitted_run(experiment: str | Experiment, config: str = CONFIG) -> Run:
    run = queued_run(experiment, config)
    transition(run.pk, RunState.SUBMITTING)
    run.refresh_from_db()
    return run


def run_with(experiment: Experiment, iterations: int | None, success: list[float]) -> Run:
    """A queued run whose config sets `runner.iterations` (none: no `runner`), with
    `success` as its `rollout/success_rate` points."""
    config = "algorithm: {name: ppo}\n" + (
        f"runner: {{iterations: {iterations}, seed: 1}}\n" if iterations is not None else ""
    )
    run = Run.objects.create(experiment=experiment, revision=experiment.latest_revision,
                             config_yaml=config)  # fmt: skip
    if success:
        key = MetricKey.objects.create(run=run, name="rollout/success_rate")
        metric_points.copy_points([(key.pk, step, v, 1.7e9) for step, v in enumerate(success)])
    return run
