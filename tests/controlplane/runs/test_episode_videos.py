"""A run's recorded episodes: listed from the trainer's `episode` events and filtered;
their videos served by their own door: only a registered episode's mp4, as video/mp4
with Range for seeking, nothing else (an unregistered file, one that is no mp4, a name
that is no plain name). The run page's event list leaves them out."""

import pytest
from django.contrib.auth import get_user_model

from controlplane.runs.artifacts import run_artifact_dir
from controlplane.runs.models import RunEvent
from controlplane.runs.run_page import recent_events
from tests.episodes import record_episodes
from tests.runs import queued_run

pytestmark = pytest.mark.django_db

SPECS = [
    {"name": "i1-t0-c0", "task": 0, "success": True},
    {"name": "i1-t0-c1", "task": 0, "success": False, "human": (5, 9)},
    {"name": "i2-t1-c0", "task": 1, "success": False, "iteration": 2, "horizon": 10},
]


@pytest.fixture
def run(settings, tmp_path):
    settings.ARTIFACTS_DIR = tmp_path / "artifacts"
    run = queued_run("videos")
    for record in record_episodes(run_artifact_dir(run.pk) / "videos", SPECS):
        RunEvent.objects.create(run=run, kind="episode", data=record)
    return run


@pytest.fixture
def viewer(client):
    client.force_login(get_user_model().objects.create_user("vera"))
    return client


def test_a_registered_episode_is_served_as_video_with_ranges(viewer, run):
    url = f"/runs/{run.pk}/episodes/i1-t0-c0.mp4"
    whole = viewer.get(url)
    body = b"".join(whole)
    assert whole.status_code == 200 and whole["Content-Type"] == "video/mp4"
    assert whole["Accept-Ranges"] == "bytes" and whole["X-Content-Type-Options"] == "nosniff"
    assert body[4:8] == b"ftyp"
    part = viewer.get(url, HTTP_RANGE="bytes=10-19")
    assert part.status_code == 206 and part.content == body[10:20]
    assert part["Content-Range"] == f"bytes 10-19/{len(body)}"
    tail = viewer.get(url, HTTP_RANGE="bytes=-5")
    assert tail.content == body[-5:] and tail.status_code == 206
    assert viewer.get(url, HTTP_RANGE=f"bytes={len(body)}-").status_code == 416


def test_nothing_but_a_registered_mp4_is_served(viewer, run):
    videos = run_artifact_dir(run.pk) / "videos"
    (videos / "unregistered.mp4").write_bytes((videos / "i1-t0-c0.mp4").read_bytes())
    assert viewer.get(f"/runs/{run.pk}/episodes/unregistered.mp4").status_code == 404
    (videos / "i1-t0-c1.mp4").write_bytes(b"<script>alert(1)</script>" * 10)  # not an mp4
    assert viewer.get(f"/runs/{run.pk}/episodes/i1-t0-c1.mp4").status_code == 404
    for name in ("..%2Findex.jsonl", "index.jsonl%00", "i1-t0-c0.mp4"):
        assert viewer.get(f"/runs/{run.pk}/episodes/{name}.mp4").status_code == 404
    other = queued_run("other")  # another run's registered name, not this run's
    assert viewer.get(f"/runs/{other.pk}/episodes/i1-t0-c0.mp4").status_code == 404


def grid(client, run, query: str = "") -> str:
    response = client.get(f"/runs/{run.pk}/episodes/?{query}")
    assert response.status_code == 200
    return response.content.decode()


def shown_names(page: str) -> list[str]:
    return [part.split('"')[0] for part in page.split('id="episode-')[1:]]


def test_the_grid_lists_newest_first_and_filters_narrow_it(viewer, run):
    assert shown_names(grid(viewer, run)) == ["i2-t1-c0", "i1-t0-c1", "i1-t0-c0"]
    assert shown_names(grid(viewer, run, "task=0&outcome=failure")) == ["i1-t0-c1"]
    assert shown_names(grid(viewer, run, "human=1")) == ["i1-t0-c1"]
    assert shown_names(grid(viewer, run, "human=0&first=2")) == ["i2-t1-c0"]
    assert shown_names(grid(viewer, run, "horizon=10")) == ["i2-t1-c0"]
    assert "not a whole number" in grid(viewer, run, "task=%C2%B2")  # "²": a digit, no number
    page = grid(viewer, run, "task=zero&outcome=maybe")
    assert "task: &#x27;zero&#x27; is not a whole number" in page
    assert "outcome: &#x27;maybe&#x27; is neither success nor failure" in page
    assert len(shown_names(page)) == 3  # the wrong filters left out
    human = grid(viewer, run, "human=1")
    assert 'class="segment-human" x="5" y="0" width="5"' in human  # steps 5 to 9


def test_a_thinned_episode_keeps_its_card_without_a_video(viewer, run):
    (run_artifact_dir(run.pk) / "videos" / "i1-t0-c0.mp4").unlink()
    page = grid(viewer, run)
    card = page.split('id="episode-i1-t0-c0"')[1].split("</figure>")[0]
    assert "Thinned" in card and "<video" not in card


def test_a_run_without_videos_says_how_to_record_them_and_events_leave_episodes_out(viewer, run):
    assert "runner.videos.every" in grid(viewer, queued_run("none"))
    RunEvent.objects.create(run=run, kind="started", data={})
    assert [event.kind for event in recent_events(run)] == ["started"]


def test_the_api_lists_filters_and_serves_episodes(run):
    from rest_framework.test import APIClient

    api = APIClient()
    api.force_authenticate(get_user_model().objects.create_user("ci"))
    page = api.get(f"/api/v1/runs/{run.pk}/episodes?outcome=failure").json()
    assert page["count"] == 2
    assert [e["name"] for e in page["results"]] == ["i2-t1-c0", "i1-t0-c1"]
    first = page["results"][1]
    assert first["human_steps"] == 5 and first["actors"][5] == "human"
    assert first["video_url"] == f"/api/v1/runs/{run.pk}/episodes/i1-t0-c1.mp4"
    assert first["thinned"] is False
    video = api.get(first["video_url"], HTTP_RANGE="bytes=0-7")
    assert video.status_code == 206 and video.content[4:8] == b"ftyp"
    paged = api.get(f"/api/v1/runs/{run.pk}/episodes?page_size=1&page=3").json()
    assert paged["count"] == 3 and [e["name"] for e in paged["results"]] == ["i1-t0-c0"]
    bad = api.get(f"/api/v1/runs/{run.pk}/episodes?human=maybe")
    assert bad.status_code == 400 and "human: " in str(bad.json())
    assert api.get(f"/api/v1/runs/{run.pk}/episodes/nope.mp4").status_code == 404
