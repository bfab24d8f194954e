"""A run's recorded episodes (trainer.videos): listed and filtered from the trainer's
`episode` events, and their videos served by a door of their own.

Only a file an `episode` event registered is served, from `<run>/videos/<name>.mp4`
(opened beneath the run's folder, no link followed), only when its header is an mp4's,
as `video/mp4` with HTTP Range (a video seeks by ranges); everything else is a 404."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, BinaryIO

from django.db.models import QuerySet
from django.http import FileResponse, HttpRequest, HttpResponse

from controlplane.core.async_streams import async_chunks
from controlplane.runs import artifacts
from controlplane.runs.artifacts import DOWNLOAD_CHUNK
from controlplane.runs.models import Run, RunEvent

NAME = re.compile(r"^[A-Za-z0-9_-]{1,100}$")
# A range answered at most this long: a video's player asks again for what follows.
MAX_RANGE_BYTES = 8 << 20
RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
VIDEO_POLICY = "sandbox; default-src 'none'; media-src 'self'"


@dataclass(frozen=True)
class EpisodeFilters:
    task: int | None = None
    horizon: int | None = None
    success: bool | None = None
    human: bool | None = None  # an operator acted in it
    first_iteration: int | None = None
    last_iteration: int | None = None


def episodes(run: Run, filters: EpisodeFilters = EpisodeFilters()) -> QuerySet[RunEvent]:
    """The run's episode events, oldest first, those `filters` keep."""
    found = RunEvent.objects.filter(run=run, kind="episode")
    if filters.task is not None:
        found = found.filter(data__task=filters.task)
    if filters.horizon is not None:
        found = found.filter(data__horizon=filters.horizon)
    if filters.success is not None:
        found = found.filter(data__success=filters.success)
    if filters.human is not None:
        found = (found.filter(data__human_steps__gt=0) if filters.human
                 else found.filter(data__human_steps=0))  # fmt: skip
    if filters.first_iteration is not None:
        found = found.filter(data__iteration__gte=filters.first_iteration)
    if filters.last_iteration is not None:
        found = found.filter(data__iteration__lte=filters.last_iteration)
    return found.order_by("created_at", "pk")


def shown(event: RunEvent, kept: set[str]) -> dict[str, Any]:
    """An episode as the pages and the API show it; `kept`: the names whose file is
    still there (the others were thinned to stay within the run's budget)."""
    data = event.data
    return {**data, "run": event.run_id, "thinned": data.get("name") not in kept}


def kept_names(run_id: int) -> set[str]:
    """The episodes whose video file is in the run's folder now."""
    return {
        found.path.removeprefix("videos/").removesuffix(".mp4")
        for found in artifacts.list_artifacts(run_id)
        if found.path.startswith("videos/") and found.path.endswith(".mp4")
    }


class EpisodeNotFound(Exception):
    pass


def open_video(run: Run, name: str) -> BinaryIO:
    """The registered episode's mp4, open; EpisodeNotFound for anything else."""
    if not NAME.fullmatch(name):
        raise EpisodeNotFound(name)
    if not RunEvent.objects.filter(run=run, kind="episode", data__name=name).exists():
        raise EpisodeNotFound(name)
    try:
        found = artifacts.open_artifact(run.pk, f"videos/{name}.mp4")
    except artifacts.ArtifactNotFound:
        raise EpisodeNotFound(name) from None
    if found.read(12)[4:8] != b"ftyp":  # not an mp4, whatever it is called
        found.close()
        raise EpisodeNotFound(name)
    found.seek(0)
    return found


def video_response(request: HttpRequest, found: BinaryIO) -> HttpResponse:
    """The whole video (streamed), or the range the request asks for (206, at most
    MAX_RANGE_BYTES of it); 416 for a range past its end."""
    size = found.seek(0, 2)
    found.seek(0)
    wanted = RANGE.match(request.headers.get("Range", "").strip())
    if not wanted or not (wanted.group(1) or wanted.group(2)):
        response: HttpResponse = FileResponse(found, content_type="video/mp4")
        response.streaming_content = async_chunks(iter(lambda: found.read(DOWNLOAD_CHUNK), b""))
        return _video_headers(response)
    with found:
        first, last = wanted.groups()
        if first:
            start, end = int(first), int(last) if last else size - 1
        else:  # the last N bytes
            start, end = max(size - int(last), 0), size - 1
        if start >= size or end < start:
            response = HttpResponse(status=416)
            response["Content-Range"] = f"bytes */{size}"
            return response
        end = min(end, size - 1, start + MAX_RANGE_BYTES - 1)
        found.seek(start)
        response = HttpResponse(found.read(end - start + 1), status=206,
                                content_type="video/mp4")  # fmt: skip
    response["Content-Range"] = f"bytes {start}-{end}/{size}"
    return _video_headers(response)


def _video_headers(response: HttpResponse) -> HttpResponse:
    response["Accept-Ranges"] = "bytes"
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = VIDEO_POLICY
    return response


def filters_from_query(query: Any) -> tuple[EpisodeFilters, list[str]]:
    """The filters a page's form (or the API's query) asks for, and what was wrong
    with the others (left out): task, horizon, first and last (iterations) are whole
    numbers; outcome is success or failure; human is 1 (intervened) or 0 (not)."""
    numbers: dict[str, int | None] = {}
    problems = []
    for field in ("task", "horizon", "first", "last"):
        text = (query.get(field) or "").strip()
        whole = text.isascii() and text.isdigit() and len(text) < 10  # "²" is a digit too
        if text and not whole:
            problems.append(f"{field}: {text[:40]!r} is not a whole number")
        numbers[field] = int(text) if whole else None
    outcome = (query.get("outcome") or "").strip()
    if outcome not in ("", "success", "failure"):
        problems.append(f"outcome: {outcome[:40]!r} is neither success nor failure")
    human = (query.get("human") or "").strip()
    if human not in ("", "0", "1"):
        problems.append(f"human: {human[:40]!r} is neither 1 nor 0")
    filters = EpisodeFilters(
        task=numbers["task"], horizon=numbers["horizon"],
        success={"success": True, "failure": False}.get(outcome),
        human={"1": True, "0": False}.get(human),
        first_iteration=numbers["first"], last_iteration=numbers["last"],
    )  # fmt: skip
    return filters, problems


def timeline(actors: list[str], rewards: list[float]) -> dict[str, Any]:
    """An episode's steps as segments of one actor (start, length), and the steps
    that earned a reward: what its timeline under the video draws."""
    segments: list[dict[str, Any]] = []
    for step, actor in enumerate(actors):
        if segments and segments[-1]["actor"] == actor:
            segments[-1]["length"] += 1
        else:
            segments.append({"actor": actor, "start": step, "length": 1})
    rewarded = [step for step, reward in enumerate(rewards) if reward > 0]
    return {"segments": segments, "rewarded": rewarded, "length": max(len(actors), 1)}


EPISODES_SHOWN = 24


def episode_grid(run: Run, query: Any) -> dict[str, Any]:
    """What the run page's episode grid shows for `query` (its filters): the newest
    EPISODES_SHOWN episodes they keep, each with its timeline, how many they keep in
    all, what was wrong with the filters, and whether the run recorded any."""
    filters, problems = filters_from_query(query)
    found = episodes(run, filters)
    kept = kept_names(run.pk)
    shown_episodes = []
    for event in found.order_by("-created_at", "-pk")[:EPISODES_SHOWN]:
        episode = shown(event, kept)
        episode["timeline"] = timeline(episode.get("actors", []), episode.get("rewards", []))
        shown_episodes.append(episode)
    return {
        "run": run,
        "episodes": shown_episodes,
        "count": found.count(),
        "problems": problems,
        "recorded": shown_episodes or RunEvent.objects.filter(run=run, kind="episode").exists(),
    }


def shared_states(runs: list[Run]) -> list[tuple[int, int]]:
    """The (task, init state) pairs that two or more of `runs` recorded an episode of,
    in order: what the compare page can show side by side."""
    seen: dict[tuple[int, int], set[int]] = {}
    for run_id, task, state in (
        RunEvent.objects.filter(run__in=runs, kind="episode")
        .values_list("run_id", "data__task", "data__init_state")
        .distinct()
    ):
        if isinstance(task, int) and isinstance(state, int):
            seen.setdefault((task, state), set()).add(run_id)
    return sorted(pair for pair, which in seen.items() if len(which) > 1)


def side_by_side(runs: list[Run], task: int, init_state: int) -> list[dict[str, Any]]:
    """For each run, its newest episode of `task` from `init_state` (None where it has
    none), with its timeline."""
    shown_episodes: list[dict[str, Any]] = []
    for run in runs:
        event = (
            RunEvent.objects.filter(
                run=run, kind="episode", data__task=task, data__init_state=init_state
            )  # fmt: skip
            .order_by("-created_at", "-pk")
            .first()
        )
        episode = None
        if event is not None:
            episode = shown(event, kept_names(run.pk))
            episode["timeline"] = timeline(episode.get("actors", []), episode.get("rewards", []))
        card_id = f"compare-{run.pk}-{episode['name']}" if episode else ""
        shown_episodes.append({"run": run, "episode": episode, "card_id": card_id})
    return shown_episodes
