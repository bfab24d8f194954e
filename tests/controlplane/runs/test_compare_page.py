"""The compare page: which runs it overlays, and a clear message for ids it cannot use."""

import json

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model

from controlplane.experiments.services import create_experiment, save_revision
from controlplane.runs.models import Run

pytestmark = pytest.mark.django_db

CONFIG = (settings.BASE_DIR / "examples/builtin_ppo.yaml").read_text()


@pytest.fixture
def viewer(client):
    client.force_login(get_user_model().objects.create_user("vic"))
    return client


def make_run(experiment) -> Run:
    return Run.objects.create(
        experiment=experiment, revision=experiment.latest_revision, config_yaml=CONFIG
    )


def test_it_names_each_run_with_its_experiment_revision(viewer):
    experiment = create_experiment("reach", CONFIG)
    first = make_run(experiment)
    seeded = CONFIG.replace("seed: 0", "seed: 1")
    revision = save_revision(experiment, seeded)
    second = Run.objects.create(experiment=experiment, revision=revision, config_yaml=seeded)
    reply = viewer.get(f"/runs/compare/?ids={second.pk},{first.pk}")
    assert reply.status_code == 200
    page = reply.content.decode()
    context = json.loads(
        page.split('id="compare-context" type="application/json">')[1].split("<")[0]
    )
    assert [(c["run"], c["label"], c["horizons"]) for c in context] == [
        (second.pk, f"run {second.pk} · reach r2", [5, 10, 15]),
        (first.pk, f"run {first.pk} · reach r1", [5, 10, 15]),
    ]
    # Only the config keys that differ, each run's value in its column.
    differences = page[page.index('id="compare-config"') :]
    assert differences.count("<tr data-key=") == 1
    row = differences[differences.index('<tr data-key="runner.seed">') :].split("</tr>")[0]
    assert row.endswith("<td><code>1</code></td><td><code>0</code></td>")


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ("", "choose at least two runs"),
        ("{a}", "choose at least two runs"),
        ("{a},x,-2", "not run ids: x, -2"),
        ("{a},999999", "no such run: 999999"),
        (",".join(str(n) for n in range(1, 20)), "at most 12 runs at once; 19 were given"),
    ],
)
def test_bad_ids_get_a_clear_message(viewer, ids, message):
    run = make_run(create_experiment("reach", CONFIG))
    reply = viewer.get("/runs/compare/", {"ids": ids.format(a=run.pk)})
    assert reply.status_code == 400
    assert message in reply.content.decode()
    assert 'id="compare-error"' in reply.content.decode()
