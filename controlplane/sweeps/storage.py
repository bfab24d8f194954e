"""Optuna's storage in the project's own database: its tables beside Django's, reached
through SQLAlchemy with the connection settings Django uses (PostgreSQL, or the SQLite
file of the one-machine mode; in tests, the test database)."""

from __future__ import annotations

import functools
from urllib.parse import quote

import optuna
from django.db import connection
from sqlalchemy.pool import NullPool

from controlplane.sweeps.models import Sweep
from controlplane.sweeps.space import SweepSpec

# Optuna logs every trial at INFO; the sweep's rows and events say the same.
optuna.logging.set_verbosity(optuna.logging.WARNING)


def database_url() -> str:
    """SQLAlchemy's URL of Django's default database as this process uses it now."""
    conf = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{conf['NAME']}"
    if connection.vendor != "postgresql":
        raise RuntimeError(f"sweeps need PostgreSQL or SQLite, not {connection.vendor}")
    user = quote(conf.get("USER") or "", safe="")
    password = quote(conf.get("PASSWORD") or "", safe="")
    login = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    port = f":{conf['PORT']}" if conf.get("PORT") else ""
    return f"postgresql+psycopg://{login}{conf.get('HOST') or ''}{port}/{conf['NAME']}"


@functools.cache
def _storage(url: str) -> optuna.storages.RDBStorage:
    # No pool: a step's few queries open and close their own connections, so no process
    # (the web's, a worker's, a test's) keeps idle sessions on the database between steps.
    # SQLite waits on the web's and worker's locks as Django's connections do (settings.py).
    engine: dict = {"poolclass": NullPool}
    if url.startswith("sqlite"):
        engine["connect_args"] = {"timeout": 20}
    return optuna.storages.RDBStorage(url, engine_kwargs=engine)


def storage() -> optuna.storages.RDBStorage:
    return _storage(database_url())


def create_study(study_name: str, spec: SweepSpec) -> optuna.Study:
    return optuna.create_study(
        study_name=study_name, storage=storage(), direction=spec.study_direction,
        sampler=spec.make_sampler(), pruner=spec.make_pruner(), load_if_exists=True,
    )  # fmt: skip


def load_study(sweep: Sweep) -> optuna.Study:
    spec = SweepSpec.model_validate(sweep.spec)
    return optuna.load_study(
        study_name=sweep.study_name, storage=storage(),
        sampler=spec.make_sampler(), pruner=spec.make_pruner(),
    )  # fmt: skip


def trial_id_of(sweep: Sweep, number: int) -> int:
    """Optuna's id of the sweep's trial `number` (what its storage is asked by)."""
    store = storage()
    study_id = store.get_study_id_from_name(sweep.study_name)
    return store.get_trial_id_from_study_id_trial_number(study_id, number)
