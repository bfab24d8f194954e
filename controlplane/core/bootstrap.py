"""First-run setup of the one-machine mode: an admin account and a demo to launch."""

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction

from controlplane.experiments.models import Experiment
from controlplane.experiments.services import create_experiment
from controlplane.inventory.models import Cluster
from controlplane.inventory.services import import_cluster_yaml

EXAMPLES_DIR = settings.BASE_DIR / "examples"
DEMO_CLUSTER_FILE = EXAMPLES_DIR / "clusters" / "one_machine.yaml"
DEMO_EXPERIMENT_FILE = EXAMPLES_DIR / "builtin_ppo.yaml"


@dataclass
class AdminAccount:
    username: str
    password: str
    created: bool


def ensure_admin(username: str = "admin") -> AdminAccount:
    """Create the admin once; its password comes from ARMATURE_ADMIN_PASSWORD or is
    generated and kept under var/ so it can be shown again on every start."""
    password_file: Path = settings.VAR_DIR / "admin_password"
    password = os.environ.get("ARMATURE_ADMIN_PASSWORD")
    if not password:
        if password_file.exists():
            password = password_file.read_text().strip()
        else:
            password = secrets.token_urlsafe(12)
            password_file.parent.mkdir(parents=True, exist_ok=True)
            password_file.write_text(password)
            password_file.chmod(0o600)
    user_model = get_user_model()
    user, created = user_model.objects.get_or_create(
        username=username, defaults={"is_staff": True, "is_superuser": True}
    )
    if created or not user.check_password(password):
        user.set_password(password)
        user.save()
    return AdminAccount(username, password, created)


@transaction.atomic
def seed_demo(owner=None) -> tuple[Cluster, Experiment]:
    """The demo cluster (this machine) and a demo experiment on the built-in env.
    Idempotent: existing objects of the same names are left as they are."""
    cluster = Cluster.objects.filter(name="one-machine").first() or import_cluster_yaml(
        "one-machine",
        DEMO_CLUSTER_FILE.read_text(),
        "This machine: one node running every component.",
    )
    experiment = Experiment.objects.filter(name="demo-builtin-ppo").first() or create_experiment(
        "demo-builtin-ppo",
        DEMO_EXPERIMENT_FILE.read_text(),
        description="PPO on the built-in reach env; learns in a few CPU minutes.",
        tags=["demo", "builtin", "ppo"],
        author=owner,
    )
    return cluster, experiment
