"""Launching a run: freeze its config and queue it for submission."""

from django.db import IntegrityError, transaction

from controlplane.access.process_settings import refuse_process_settings
from controlplane.experiments.models import Experiment, Revision
from controlplane.inventory.models import Cluster
from controlplane.inventory.selectors import inventory_arms
from controlplane.inventory.services import to_trainer_cluster
from controlplane.runs import artifacts, dispatch
from controlplane.runs.models import Run, RunEvent
from trainer.cluster import ClusterConfigError, cluster_to_dict
from trainer.config.errors import ConfigError
from trainer.config.inventory_arms import bind_to_inventory
from trainer.config.loading import apply_override, dump_config, parse_yaml, validate_config
from trainer.config.path_roots import paths_outside


def freeze_config(
    revision: Revision, overrides: list[str], cluster: Cluster | None, user=None
) -> str:
    """The config the trainer will run: the revision, the overrides, the cluster section;
    validated, its real arms bound to the limits the inventory declares for them (of
    `cluster`, or of every cluster when none is picked), and written out with every
    default. Raises ConfigError, also when the experiment's own cluster section (a launch
    without a stored cluster) has process-level settings that `user` may not launch, when
    the stored cluster's rows no longer form a valid cluster, when an arm's address is
    not one the inventory declares, and when a file it names lies outside the folders a
    run may use (`artifacts.allowed_roots`)."""
    data = parse_yaml(revision.config_yaml) or {}
    for override in overrides:
        apply_override(data, override)
    if cluster is None:
        refuse_process_settings(user, data, "launched")
    else:
        try:
            data["cluster"] = cluster_to_dict(to_trainer_cluster(cluster))
        except ClusterConfigError as error:  # rows edited into an invalid cluster
            raise ConfigError(error.issues) from None
    config = validate_config(data)
    outside = paths_outside(config, artifacts.allowed_roots())
    if outside:
        raise ConfigError(outside)
    return dump_config(bind_to_inventory(config, inventory_arms(cluster), refuse_undeclared=True))


def launch_run(
    experiment: Experiment,
    *,
    user,
    revision: Revision | None = None,
    cluster: Cluster | None = None,
    overrides: list[str] | None = None,
    idempotency_key: str | None = None,
    timeout_s: int | None = None,
    tags: list[str] | None = None,
) -> tuple[Run, bool]:
    """Create a queued run and hand it to a worker for submission.

    Returns (run, created); with an idempotency key already used by this user, the
    existing run comes back and nothing new starts. The run's tags are its experiment's
    followed by `tags`."""
    existing = run_with_key(user, idempotency_key)
    if existing is not None:
        return existing, False
    revision = revision or experiment.latest_revision
    overrides = list(overrides or [])
    config_yaml = freeze_config(revision, overrides, cluster, user)
    return queue_run(
        user, idempotency_key, f"by {user}",
        experiment=experiment, revision=revision, cluster=cluster, overrides=overrides,
        config_yaml=config_yaml, timeout_s=timeout_s,
        tags=_merged_tags(experiment.tags, tags or []),
        progress_total=validate_config(parse_yaml(config_yaml)).runner.iterations,
    )  # fmt: skip


def run_with_key(user, idempotency_key: str | None) -> Run | None:
    """The run this user already launched with this idempotency key, if any."""
    if not idempotency_key:
        return None
    return Run.objects.filter(created_by=user, idempotency_key=idempotency_key).first()


def queue_run(user, idempotency_key: str | None, launched: str, **fields) -> tuple[Run, bool]:
    """Store a queued run of `fields` with its `launched` event and hand it to a worker
    after the commit: (run, True); (the run, False) when the same key raced in first."""
    try:
        with transaction.atomic():
            run = Run.objects.create(created_by=user, idempotency_key=idempotency_key, **fields)
            RunEvent.objects.create(run=run, kind="launched", message=launched)
            dispatch.submit_later(run.pk)
    except IntegrityError:  # the same key raced in from a second request
        return Run.objects.get(created_by=user, idempotency_key=idempotency_key), False
    return run, True


def _merged_tags(*groups: list[str]) -> list[str]:
    return list(dict.fromkeys(tag for group in groups for tag in group))
