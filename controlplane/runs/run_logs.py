"""A run's job log as the run page and the API show it.

The page's log panel polls every 3 s per open tab. Each poll gets the log's last
`TAIL_LINES` lines, which Ray reads from the end of the file (ray_jobs.log_tail), kept
for `ARMATURE_LOG_TAIL_CACHE_S` in the cache, so that every tab on a run costs Ray one
bounded read per window; each user may poll `ARMATURE_LOG_POLLS_PER_MINUTE` times a
minute. A download streams the whole log chunk by chunk (at most
`ARMATURE_LOG_DOWNLOADS_PER_MINUTE` a minute per user). Neither holds more than the
tail or one chunk in the web server's memory, whatever the log's size.
"""

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.cache import cache
from django.http import HttpResponse, StreamingHttpResponse

from controlplane.core.async_streams import async_chunks
from controlplane.runs import ray_jobs
from controlplane.runs.log_text import without_escapes
from controlplane.runs.models import Run

TAIL_LINES = 200
# The panel's lines, at most this many bytes of them (a job printing one endless line
# has a one-line tail as long as its log).
TAIL_MAX_BYTES = 256 * 1024
RATE_WINDOW_S = 60


def panel_tail(run: Run) -> str:
    """The panel's text: the current attempt's last lines ("" before it has a job).
    Raises RayJobsError. Ray's answer, a failure included, is kept for the cache window:
    a Ray that does not answer is not asked again by every tab."""
    if not run.ray_job_id:
        return ""
    key = f"run-log-tail:{run.pk}:{run.submission_id}"
    kept = cache.get(key)
    if kept is None:
        try:
            kept = ("", ray_jobs.log_tail(run.submission_id, TAIL_LINES, TAIL_MAX_BYTES))
        except ray_jobs.RayJobsError as error:
            kept = (str(error), "")
        cache.set(key, kept, settings.ARMATURE_LOG_TAIL_CACHE_S)
    error, text = kept
    if error:
        raise ray_jobs.RayJobsError(error)
    return "\n".join(text.splitlines()[-TAIL_LINES:])


def log_download(run: Run, filename: str = "", escapes: bool = False) -> StreamingHttpResponse:
    """The current attempt's whole log as a streamed text/plain response (as an
    attachment named `filename` if given), without terminal escapes unless `escapes`.
    Raises RayJobsError when Ray refuses it."""
    chunks = ray_jobs.log_stream(run.submission_id) if run.ray_job_id else iter(())
    if not escapes:
        chunks = without_escapes(chunks)
    response = StreamingHttpResponse(async_chunks(chunks), content_type="text/plain; charset=utf-8")
    if filename:
        response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


def polls_refused(user: AbstractBaseUser) -> HttpResponse | None:
    """429 once `user` has polled ARMATURE_LOG_POLLS_PER_MINUTE times in the window;
    otherwise None, and this poll is counted."""
    return _refused(user, "log panel polls", settings.ARMATURE_LOG_POLLS_PER_MINUTE)


def downloads_refused(user: AbstractBaseUser) -> HttpResponse | None:
    """429 once `user` has downloaded ARMATURE_LOG_DOWNLOADS_PER_MINUTE logs in the
    window; otherwise None, and this download is counted."""
    return _refused(user, "log downloads", settings.ARMATURE_LOG_DOWNLOADS_PER_MINUTE)


def _refused(user: AbstractBaseUser, what: str, per_minute: int) -> HttpResponse | None:
    """A count per user and kind in the cache, shared by every web process, that starts
    at the first use and lasts RATE_WINDOW_S."""
    key = f"{what.replace(' ', '-')}:{user.pk}"
    cache.add(key, 0, RATE_WINDOW_S)
    try:
        count = cache.incr(key)
    except ValueError:  # the window ended between the two calls: a new one starts
        cache.add(key, 1, RATE_WINDOW_S)
        count = 1
    if count <= per_minute:
        return None
    response = HttpResponse(
        f"Too many {what}: at most {per_minute} a minute per user. Try again shortly.",
        status=429,
        content_type="text/plain; charset=utf-8",
    )
    response["Retry-After"] = str(RATE_WINDOW_S)
    return response
