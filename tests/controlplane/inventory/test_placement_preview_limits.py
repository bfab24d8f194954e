"""The placement preview is bounded for anyone who may post one (viewers): a placement
past the preview's process limit answers the count per component and the limit, never
the plan; a cluster past the resource limit is refused before anything is numbered;
and the work of answering stays small (peak memory measured, never time)."""

import json
import tracemalloc

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from rest_framework.test import APIClient

from controlplane.inventory.placement_preview import MAX_CELLS_DRAWN, MAX_PREVIEW_PROCESSES
from controlplane.inventory.services import import_cluster_yaml
from trainer.cluster.validation import MAX_RESOURCES

pytestmark = pytest.mark.django_db


def cluster_yaml(nodes: int, accelerators: int) -> str:
    return (
        f"cluster:\n  num_nodes: {nodes}\n  node_groups:\n    - label: gpu\n"
        f"      node_ranks: 0-{nodes - 1}\n"
        f"      accelerators: {{type: H100, count: {accelerators}}}\n"
    )


@pytest.fixture
def viewer_api() -> APIClient:
    client = APIClient()
    client.force_authenticate(get_user_model().objects.create_user("vic"))
    return client


def peak_bytes_of(call):
    """The call's answer and its peak of Python allocations, after a first call has
    imported whatever the request path imports lazily."""
    call()
    tracemalloc.start()
    try:
        result = call()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_placement_past_the_limit_answers_its_figures_not_the_plan(viewer_api):
    # The review's ~170-byte request: 100 nodes of 1024 accelerators, placed over all.
    body = {"cluster_yaml": cluster_yaml(100, 1024), "placement": {"actor": "all"}}
    assert len(json.dumps(body)) < 200
    response, peak = peak_bytes_of(
        lambda: viewer_api.post("/api/v1/placement/preview", body, format="json")
    )
    assert response.status_code == 400
    answer = response.json()
    assert answer["summary"] == {
        "processes": {"actor": 102_400}, "total": 102_400, "limit": MAX_PREVIEW_PROCESSES
    }  # fmt: skip
    assert answer["errors"][0]["rule"] == "placement.too_many_processes"
    assert "102,400" in answer["errors"][0]["message"]
    assert "plan" not in answer and len(response.content) < 2_000
    assert peak < 10 * 2**20  # the plan (about 300 MB before) was never built


def test_a_placement_within_the_limit_is_answered_whole(viewer_api):
    body = {"cluster_yaml": cluster_yaml(10, 8), "placement": {"actor": "all"}}
    response = viewer_api.post("/api/v1/placement/preview", body, format="json")
    assert response.status_code == 200
    assert len(response.json()["plan"]["components"]["actor"]["processes"]) == 80


def test_a_cluster_past_the_resource_limit_is_refused_before_numbering(viewer_api):
    # 100,000 nodes of 1024 accelerators: 32 s and 7 GB to number before the limit.
    body = {"cluster_yaml": cluster_yaml(100_000, 1024), "placement": {"actor": "0"}}
    response, peak = peak_bytes_of(
        lambda: viewer_api.post("/api/v1/placement/preview", body, format="json")
    )
    assert response.status_code == 400
    (error,) = response.json()["errors"]
    assert error["rule"] == "cluster.too_large" and f"{MAX_RESOURCES:,}" in error["message"]
    assert peak < 50 * 2**20


def test_the_page_shows_the_figures_and_a_bounded_grid():
    import_cluster_yaml("big", cluster_yaml(100, 1024))
    page = Client()
    page.force_login(get_user_model().objects.create_user("vic"))
    response = page.post("/cluster/big/placement/preview/", {"placement": "actor: all"})
    html = response.content.decode()
    assert response.status_code == 422
    assert "makes 102,400 processes" in html and "at most 10,000" in html
    assert html.count('class="cell ') <= MAX_CELLS_DRAWN
    assert "more nodes" in html
