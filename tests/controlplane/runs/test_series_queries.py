"""Series, latest, success and runs-list queries on a big database: 1,000 runs and one
run with 100,000 points. Each endpoint answers in a bounded number of queries, the
series payload of 1,000 buckets stays small, bucketing keeps a spike visible, and
success rates come from summed counts."""

import json
import random
from collections import defaultdict

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.experiments.services import create_experiment
from controlplane.runs import metric_points, series
from controlplane.runs.models import MetricKey, MetricPoint, Run, RunState

pytestmark = [pytest.mark.django_db, pytest.mark.embedded]

CONFIG = "algorithm: {name: ppo}\n"
BIG_STEPS = 10_000  # × 10 keys = 100,000 points
BIG_KEYS = [f"losses/k{i}" for i in range(8)] + ["charts/env_steps", "rollout/success_rate"]
SPIKE_STEP, SPIKE = 4321, 1e6


@pytest.fixture(scope="module")
def big(django_db_setup, django_db_blocker):
    """1,000 runs (each with a success point) and one run with 100,000 points, bulk-made
    once for the module and removed after it."""
    with django_db_blocker.unblock():
        user = get_user_model().objects.create_user("vera")
        user.groups.add(Group.objects.get_or_create(name="viewer")[0])
        experiment = create_experiment("big", CONFIG, tags=["sweep"])
        revision = experiment.latest_revision
        now = timezone.now()
        states = [RunState.SUCCEEDED, RunState.RUNNING, RunState.FAILED]
        runs = Run.objects.bulk_create(
            Run(
                experiment=experiment,
                revision=revision,
                config_yaml=CONFIG,
                state=states[i % 3],
                created_by=user,
                tags=["odd"] if i % 2 else [],
                started_at=now - timezone.timedelta(seconds=i),
                finished_at=now,
            )
            for i in range(1000)
        )
        keys = MetricKey.objects.bulk_create(
            MetricKey(run=run, name=series.OVERALL_SUCCESS_KEY) for run in runs
        )
        metric_points.copy_points(
            [(key.pk, 1, (i % 100) / 100, 1.7e9) for i, key in enumerate(keys)]
        )
        big_run = runs[0]
        big_keys = {
            name: MetricKey.objects.get_or_create(run=big_run, name=name)[0].pk for name in BIG_KEYS
        }
        rng = random.Random(0)
        rows = []
        for step in range(BIG_STEPS):
            for name, key_id in big_keys.items():
                if name == "charts/env_steps":
                    value = float(step * 512)
                elif name == "losses/k0" and step == SPIKE_STEP:
                    value = SPIKE
                else:
                    value = rng.random()
                rows.append((key_id, step, value, 1.7e9 + step))
        for start in range(0, len(rows), 20_000):
            metric_points.copy_points(rows[start : start + 20_000])
        yield big_run
        MetricPoint.objects.filter(key__run__experiment=experiment).delete()
        Run.objects.filter(experiment=experiment).delete()
        experiment.delete()
        user.delete()


@pytest.fixture
def api(big):
    client = APIClient()
    client.force_authenticate(get_user_model().objects.get(username="vera"))
    return client


def get(api, url: str, max_queries: int) -> dict:
    """The JSON answer, checking the query count stays within `max_queries`."""
    with CaptureQueriesContext(connection) as queries:
        response = api.get(url)
    assert response.status_code == 200, response.content[:500]
    assert len(queries) <= max_queries, [q["sql"][:120] for q in queries]
    return response.json()


def test_the_runs_list_is_one_query_per_page_whatever_the_number_of_runs(api):
    answer = get(api, "/api/v1/runs?ordering=-success&page_size=50", max_queries=4)
    assert answer["count"] == 1000 and len(answer["results"]) == 50
    assert answer["next"] and answer["previous"] is None
    first = answer["results"][0]
    assert first["latest_success"] == 0.99
    assert first["duration_s"] is not None and first["tags"] is not None
    rates = [run["latest_success"] for run in answer["results"]]
    assert rates == sorted(rates, reverse=True)


def test_the_runs_list_filters_and_sorts(api):
    odd = get(api, "/api/v1/runs?tag=odd&state=running&page_size=200", max_queries=4)
    assert odd["count"] == len([i for i in range(1000) if i % 2 and i % 3 == 1])
    assert all("odd" in run["tags"] and run["state"] == "running" for run in odd["results"])
    by_duration = get(api, "/api/v1/runs?ordering=duration&creator=vera", max_queries=4)
    durations = [run["duration_s"] for run in by_duration["results"]]
    assert durations == sorted(durations) and by_duration["count"] == 1000
    assert get(api, "/api/v1/runs?experiment=nope", max_queries=4)["count"] == 0
    bad = api.get("/api/v1/runs?ordering=size&state=asleep")
    assert bad.status_code == 400 and set(bad.json()) == {"ordering", "state"}


def test_a_series_of_100000_points_comes_back_in_1000_buckets_with_its_spike(api, big):
    url = f"/api/v1/runs/{big.pk}/series?keys=losses/*,charts/env_steps&buckets=1000"
    with CaptureQueriesContext(connection) as queries:
        response = api.get(url)
    assert response.status_code == 200
    assert len(queries) <= 5
    one_key = api.get(f"/api/v1/runs/{big.pk}/series?keys=losses/k0&buckets=1000")
    assert len(one_key.content) < 100_000  # one key's 1,000 buckets
    answer = response.json()
    assert answer["last_step"] == BIG_STEPS - 1 and answer["x"] == "step"
    assert set(answer["series"]) == {f"losses/k{i}" for i in range(8)} | {"charts/env_steps"}
    k0 = answer["series"]["losses/k0"]
    assert len(k0["x"]) == 1000 and sum(k0["count"]) == BIG_STEPS
    assert max(k0["max"]) == SPIKE  # the one-step spike survives downsampling
    spiked = k0["max"].index(SPIKE)
    assert k0["x"][spiked - 1] < SPIKE_STEP <= k0["x"][spiked]
    assert max(k0["mean"]) < SPIKE and min(k0["min"]) >= 0
    env = answer["series"]["charts/env_steps"]
    assert env["last"] == [x * 512 for x in env["x"]]  # last = the bucket's last step


def test_series_step_range_x_axes_and_bad_requests(api, big):
    base = f"/api/v1/runs/{big.pk}/series?keys=losses/k1"
    window = get(api, f"{base}&start=100&end=199&buckets=1000", max_queries=5)
    assert window["series"]["losses/k1"]["x"] == list(range(100, 200))  # ≤ N: every point
    by_env = get(api, f"{base}&start=100&end=199&x=env_steps&buckets=10", max_queries=6)
    xs = by_env["series"]["losses/k1"]["x"]
    assert len(xs) == 10 and xs[-1] == 199 * 512
    by_time = get(api, f"{base}&start=100&end=109&x=wall_time", max_queries=5)
    assert by_time["series"]["losses/k1"]["x"] == [1.7e9 + s for s in range(100, 110)]
    wrong_x = api.get(f"{base}&x=epoch")
    assert wrong_x.status_code == 400 and "step, env_steps, wall_time" in wrong_x.json()["detail"]
    assert api.get(f"{base}&buckets=5001").status_code == 400
    assert api.get(f"/api/v1/runs/{big.pk}/series").status_code == 400
    nothing = get(api, f"/api/v1/runs/{big.pk}/series?keys=absent/*", max_queries=4)
    assert nothing["series"] == {} and nothing["last_step"] is None


def test_latest_is_one_query_for_every_key(api, big):
    with CaptureQueriesContext(connection) as queries:
        answer = series.latest(big.pk)
    assert len(queries) == 1
    assert answer["step"] == BIG_STEPS - 1
    assert set(answer["values"]) == set(BIG_KEYS)
    assert answer["values"]["charts/env_steps"] == {
        "step": BIG_STEPS - 1, "value": (BIG_STEPS - 1) * 512.0, "wall_time": 1.7e9 + BIG_STEPS - 1
    }  # fmt: skip
    assert get(api, f"/api/v1/runs/{big.pk}/latest", max_queries=3) == json.loads(
        json.dumps(answer)
    )


def test_raw_points_and_events_come_in_pages(api, big):
    url = f"/api/v1/runs/{big.pk}/metrics?key=losses/k2&limit=4000"
    first = get(api, url, max_queries=3)
    assert [p["step"] for p in first["points"]] == list(range(4000))
    assert first["next_after"] == 3999
    rest = get(api, f"{url}&after=7999", max_queries=3)
    assert len(rest["points"]) == BIG_STEPS - 8000 and rest["next_after"] is None
    assert api.get(f"{url[:-4]}20000").status_code == 400  # limit above the maximum
    assert set(get(api, f"/api/v1/runs/{big.pk}/metrics", max_queries=3)["latest"]) == set(BIG_KEYS)
    for n in range(5):
        big.events.create(kind="note", message=str(n))
    page = get(api, f"/api/v1/runs/{big.pk}/events?limit=3", max_queries=3)
    assert [e["message"] for e in page["results"]] == ["0", "1", "2"]
    after = page["next_after"]
    tail = get(api, f"/api/v1/runs/{big.pk}/events?limit=3&after={after}", max_queries=3)
    assert [e["message"] for e in tail["results"]] == ["3", "4"] and tail["next_after"] is None


@pytest.fixture
def counted_run(big):
    """Three iterations of two tasks at horizons 5 and 10, counts made by hand."""
    run = Run.objects.create(experiment=big.experiment, revision=big.revision, config_yaml=CONFIG)
    # step: {(task, horizon): (successes, episodes)}
    by_step = {
        1: {("1", "5"): (1, 4), ("1", "10"): (0, 4), ("2", "5"): (4, 4)},
        2: {("1", "5"): (3, 4), ("2", "5"): (0, 2), ("2", "10"): (1, 2)},
        3: {("2", "10"): (9, 10)},
    }
    for step, cells in by_step.items():
        values: dict[str, float] = defaultdict(float)
        for (task, horizon), (won, total) in cells.items():
            for prefix in ("counts/", f"counts/h{horizon}/", f"counts/task{task}/",
                           f"counts/task{task}/h{horizon}/"):  # fmt: skip
                values[f"{prefix}successes"] += won
                values[f"{prefix}episodes"] += total
        rate = values["counts/successes"] / values["counts/episodes"]
        metric_points.store_points(
            run.pk, step, 1.7e9 + step, {**values, "rollout/success_rate": rate}
        )
    return run


def test_success_rates_come_from_summed_counts(api, counted_run):
    answer = get(api, f"/api/v1/runs/{counted_run.pk}/success", max_queries=8)
    assert answer["overall"] == {
        "x": [1, 2, 3], "successes": [5, 4, 9], "episodes": [12, 8, 10],
        "rate": [5 / 12, 4 / 8, 9 / 10],
    }  # fmt: skip
    assert answer["horizons"]["5"]["rate"] == [5 / 8, 3 / 6]
    assert answer["horizons"]["10"] == {
        "x": [1, 2, 3], "successes": [0, 1, 9], "episodes": [4, 2, 10], "rate": [0, 0.5, 0.9]
    }  # fmt: skip
    assert list(answer["tasks"]) == ["1", "2"]
    assert answer["tasks"]["2"]["rate"] == [1.0, 1 / 4, 9 / 10]
    # One bucket over steps 1-3: summed counts, not the mean of the three rates.
    merged = get(api, f"/api/v1/runs/{counted_run.pk}/success?buckets=1", max_queries=8)
    assert merged["overall"]["rate"] == [18 / 30]
    assert merged["overall"]["episodes"] == [30]
    assert merged["tasks"]["1"] == {"x": [2], "successes": [4], "episodes": [12], "rate": [4 / 12]}
    assert answer["table"] == [
        {"task": "1", "step": 2, "rate": 3 / 4, "successes": 3, "episodes": 4,
         "horizons": {"5": 3 / 4}},
        {"task": "2", "step": 3, "rate": 9 / 10, "successes": 9, "episodes": 10,
         "horizons": {"10": 9 / 10}},
    ]  # fmt: skip


def test_older_runs_without_counts_fall_back_to_rates(api, big):
    run = Run.objects.create(experiment=big.experiment, revision=big.revision, config_yaml=CONFIG)
    for step in (1, 2):
        metric_points.store_points(run.pk, step, 1.7e9, {
            "rollout/success_rate": step / 4, "rollout/plan_success_rate_h5": step / 8,
            "rollout/success_rate_task_3": step / 2, "losses/value_loss": 1.0,
        })  # fmt: skip
    answer = get(api, f"/api/v1/runs/{run.pk}/success", max_queries=8)
    assert answer["overall"] == {
        "x": [1, 2], "rate": [0.25, 0.5], "successes": [None, None], "episodes": [None, None]
    }  # fmt: skip
    assert answer["horizons"]["5"]["rate"] == [0.125, 0.25]
    assert answer["tasks"]["3"]["rate"] == [0.5, 1.0]
    assert answer["table"] == [{"task": "3", "step": 2, "rate": 1.0, "successes": None,
                                "episodes": None, "horizons": {}}]  # fmt: skip


def test_sparse_keys_keep_every_point_and_a_step_stored_twice_gives_one_last():
    experiment = create_experiment("sparse", CONFIG)
    run = Run.objects.create(
        experiment=experiment, revision=experiment.latest_revision, config_yaml=CONFIG
    )
    ids = metric_points.key_ids(run.pk, ["dense", "sparse", "resumed"])
    rows = [(ids["dense"], step, float(step), 1.7e9 + step) for step in range(3000)]
    rows += [(ids["sparse"], step, float(step), 1.7e9) for step in (0, 1, 2, 2999)]
    rows += [(ids["resumed"], step, 1.0, 1.7e9) for step in range(11)]
    metric_points.copy_points(rows)
    metric_points.copy_points([(ids["resumed"], 10, 2.0, 1.8e9)])  # a resumed attempt's step 10
    answer = series.series(run.pk, ["dense", "sparse", "resumed"], buckets=100)
    dense, sparse, resumed = (answer["series"][k] for k in ("dense", "sparse", "resumed"))
    assert len(dense["x"]) == 100 and sum(dense["count"]) == 3000
    assert dense["x"][:2] == [29, 59] and dense["last"][:2] == [29.0, 59.0]
    assert sparse["x"] == [0, 1, 2, 2999] and sparse["count"] == [1, 1, 1, 1]
    assert resumed["x"] == list(range(11)) and resumed["count"][-1] == 2
    assert resumed["last"][-1] == 2.0 and resumed["max"][-1] == 2.0
