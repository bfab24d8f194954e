"""First-run setup of the one-machine mode: an admin account (whose password is shown
once, when it is set) and a demo to launch."""

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from axes.utils import reset as reset_lockouts
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
CONSOLE_DEMO_FILE = EXAMPLES_DIR / "builtin_rlpd_console.yaml"
VLA_DEMO_FILE = EXAMPLES_DIR / "builtin_vla_sft.yaml"
PI0_DEMO_FILE = EXAMPLES_DIR / "builtin_pi0_sft.yaml"
ADMIN_USERNAME = "admin"
PASSWORD_FILE_NAME = "admin_password"


@dataclass
class AdminAccount:
    username: str
    created: bool
    # The plain password, only when it was set just now (to show once); never read back.
    password: str | None
    password_file: Path  # where a generated password is kept, readable by its owner only


def admin_password_file() -> Path:
    return settings.VAR_DIR / PASSWORD_FILE_NAME


def write_password_file(password: str) -> Path:
    """Keep `password` in var/admin_password, readable and writable by its owner only
    (0600 from the start: it is never on disk with a wider mode, even briefly)."""
    path = admin_password_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    draft = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(password)
    os.chmod(draft, 0o600)  # O_CREAT's mode is filtered by the umask; say it outright
    os.replace(draft, path)
    return path


def ensure_admin(username: str = ADMIN_USERNAME) -> AdminAccount:
    """Create the admin at the first start, and only then: its password comes from
    ARMATURE_ADMIN_PASSWORD, or is generated and kept in var/admin_password. Later starts
    leave the account alone; `./armature reset-admin-password` sets a new password."""
    user_model = get_user_model()
    if user_model.objects.filter(username=username).exists():
        return AdminAccount(username, False, None, admin_password_file())
    given = os.environ.get("ARMATURE_ADMIN_PASSWORD")
    password = given or secrets.token_urlsafe(12)
    with transaction.atomic():
        user, created = user_model.objects.get_or_create(
            username=username, defaults={"is_staff": True, "is_superuser": True}
        )
        if not created:  # another process created it meanwhile: theirs stands
            return AdminAccount(username, False, None, admin_password_file())
        user.set_password(password)  # only Django's hash is stored
        user.save(update_fields=["password"])
    if not given:  # whoever set the variable knows the password already
        write_password_file(password)
    return AdminAccount(username, True, password, admin_password_file())


def reset_admin_password(username: str = ADMIN_USERNAME) -> AdminAccount:
    """A new generated password for the admin (created if missing), written to
    var/admin_password; lifts the login lockouts of that username as well."""
    password = secrets.token_urlsafe(12)
    user_model = get_user_model()
    with transaction.atomic():
        user, created = user_model.objects.get_or_create(
            username=username, defaults={"is_staff": True, "is_superuser": True}
        )
        user.set_password(password)
        user.save(update_fields=["password"])
    reset_lockouts(username=username)
    return AdminAccount(username, created, password, write_password_file(password))


@transaction.atomic
def seed_demo(owner=None) -> tuple[Cluster, Experiment]:
    """The demo cluster (this machine) and a demo experiment on the built-in env (and a
    second one whose robots operators take over in the Console). Idempotent: existing
    objects of the same names are left as they are."""
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
    if not Experiment.objects.filter(name="demo-console").exists():
        create_experiment(
            "demo-console",
            CONSOLE_DEMO_FILE.read_text(),
            description="RLPD on the built-in env; take its simulated robots over in the "
            "Console while it runs.",
            tags=["demo", "builtin", "rlpd", "console"],
            author=owner,
        )
    if not Experiment.objects.filter(name="demo-vla").exists():
        create_experiment(
            "demo-vla",
            vla_demo_yaml(),
            description="SFT of a tiny vision-language-action model on the built-in env "
            "(camera view + instruction in, action tokens out); start GRPO from its run "
            "with actor.model.init_from=<its run folder>.",
            tags=["demo", "builtin", "vla", "sft"],
            author=owner,
        )
    if not Experiment.objects.filter(name="demo-pi0").exists():
        create_experiment(
            "demo-pi0",
            vla_demo_yaml(PI0_DEMO_FILE),
            description="SFT of a tiny π0 (flow matching, chunks of 50 actions) on the "
            "built-in env; start GRPO or PPO from its run with "
            "actor.model.init_from=<its run folder>.",
            tags=["demo", "builtin", "vla", "pi0", "sft"],
            author=owner,
        )
    return cluster, experiment


def vla_demo_yaml(example: Path = VLA_DEMO_FILE) -> str:
    """A VLA SFT example with its model folder and demo file in this machine's var/
    folder: a run's job works in a folder of its own, and every run then shares the one
    tiny model and the one recording."""
    text = example.read_text()
    for relative in ("var/models/", "var/demos/"):
        text = text.replace(relative, f"{settings.VAR_DIR / relative.removeprefix('var/')}/")
    return text
