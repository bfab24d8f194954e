"""The runs list's chosen columns: any config key or metric, shown for each run and
sorted across every run the filters keep (numbers by value, runs without one last),
in a number of queries that does not grow with the runs; a wrong column is named."""

import re

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext

from controlplane.experiments.services import create_experiment
from tests.runs import run_with

pytestmark = pytest.mark.django_db

ITERATIONS = "config:runner.iterations"
SUCCESS = "metric:rollout/success_rate"


@pytest.fixture
def runs(client):
    client.force_login(get_user_model().objects.create_user("vera"))
    experiment = create_experiment("columns", "algorithm: {name: ppo}\n")
    # iterations 9 and 10 sort as numbers (10 after 9), not as text
    return {
        "nine": run_with(experiment, 9, [0.1, 0.7]),  # last value 0.7
        "ten": run_with(experiment, 10, [0.9, 0.2]),  # last value 0.2
        "hundred": run_with(experiment, 100, []),
        "none": run_with(experiment, None, [0.5]),
    }


def listed(client, query: str) -> tuple[list[int], dict[int, list[str]], str]:
    page = client.get(f"/runs/?{query}").content.decode()
    order = [int(pk) for pk in re.findall(r'<tr id="run-row-(\d+)"', page)]
    cells = {}
    for pk in order:
        row = page.split(f'<tr id="run-row-{pk}"')[1].split("</tr>")[0]
        cells[pk] = re.findall(r'<td class="chosen num">([^<]*)</td>', row)
    return order, cells, page


def test_chosen_columns_show_each_runs_config_value_and_last_metric(client, runs):
    order, cells, page = listed(client, f"col={ITERATIONS}&col={SUCCESS}")
    assert cells[runs["nine"].pk] == ["9", "0.7"]
    assert cells[runs["ten"].pk] == ["10", "0.2"]
    assert cells[runs["hundred"].pk] == ["100", "—"]
    assert cells[runs["none"].pk] == ["—", "0.5"]
    assert 'data-column="config:runner.iterations"' in page
    assert '<option value="metric:rollout/success_rate">' in page  # the picker offers it
    assert '<option value="config:runner.seed">' in page


def test_a_chosen_column_sorts_every_run_numbers_by_value_missing_last(client, runs):
    by_iterations, _, page = listed(client, f"col={ITERATIONS}&sort={ITERATIONS}")
    assert by_iterations == [runs[n].pk for n in ("nine", "ten", "hundred", "none")]
    assert 'aria-sort="ascending"' in page
    down, _, page = listed(client, f"col={ITERATIONS}&sort=-{ITERATIONS}")
    assert down == [runs[n].pk for n in ("hundred", "ten", "nine", "none")]
    by_success, _, _ = listed(client, f"col={SUCCESS}&sort=-{SUCCESS}")
    assert by_success == [runs[n].pk for n in ("nine", "none", "ten", "hundred")]


def test_wrong_columns_are_named_and_the_rest_is_shown(client, runs):
    _, cells, page = listed(client, f"col=runner.iterations&col={SUCCESS}&sort=-config:seed")
    assert "column &#x27;runner.iterations&#x27;: write config:&lt;dotted.key&gt;" in page
    assert "sort: &#x27;config:seed&#x27; is not a shown column" in page
    assert cells[runs["nine"].pk] == ["0.7"]


def test_columns_cost_no_query_per_run(client, runs):
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            response = client.get(f"/runs/?col={ITERATIONS}&col={SUCCESS}&sort=-{SUCCESS}")
        assert response.status_code == 200
        return len(captured)

    few = queries()
    experiment = runs["nine"].experiment
    for index in range(12):
        run_with(experiment, index, [index / 12])
    assert queries() == few


def test_the_sort_menu_shows_a_column_sort_and_an_ordering_picked_there_wins(client, runs):
    query = f"col={ITERATIONS}&sort=-{ITERATIONS}"
    _, _, page = listed(client, query)
    assert '<option value="" selected>by runner.iterations (its column)</option>' in page
    # Apply sends the menu's choice: an ordering picked there replaces the column's sort.
    oldest, _, page = listed(client, f"{query}&ordering=created")
    assert oldest == [runs[n].pk for n in ("nine", "ten", "hundred", "none")]
    assert "(its column)" not in page and "aria-sort" not in page
    # The header's link drops the menu's ordering, so its sort applies.
    link = re.search(r'href="\?([^"]*)" title="sort by runner.iterations', page).group(1)
    assert "ordering" not in link.replace("&amp;", "&")
