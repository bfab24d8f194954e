"""A run's files over the API and the run page: only what really lies inside the run's
own folder under the artifacts root is listed or served. A run folder, sub-folder or
file that is a symbolic link (a job on shared storage can make one) is refused, and a
path the operating system cannot even look up is a 404, not a 500."""

import pytest
from django.contrib.auth import get_user_model

from tests.runs import queued_run

pytestmark = pytest.mark.django_db

SECRET = b"SECRET_KEY=do-not-serve-me\n"


@pytest.fixture
def viewer(client):
    client.force_login(get_user_model().objects.create_user("vera"))
    return client


@pytest.fixture
def outside(tmp_path):
    """A folder outside the artifacts root holding a secret."""
    folder = tmp_path / "outside"
    (folder / "deeper").mkdir(parents=True)
    (folder / "secret.txt").write_bytes(SECRET)
    (folder / "deeper" / "secret.txt").write_bytes(SECRET)
    return folder


@pytest.fixture
def root(settings, tmp_path):
    """The artifacts root, configured as a link to the real folder (an admin may mount
    it so): containment is judged against the real root."""
    real = tmp_path / "real-artifacts"
    real.mkdir()
    (tmp_path / "artifacts").symlink_to(real)
    settings.ARTIFACTS_DIR = tmp_path / "artifacts"
    return real


@pytest.fixture
def run():
    return queued_run("files")


def listed(client, run) -> list[str]:
    return [f["path"] for f in client.get(f"/api/v1/runs/{run.pk}/artifacts").json()]


def status_of(client, run, path: str) -> tuple[int, int]:
    """(API status, run page door status) of one file."""
    api = client.get(f"/api/v1/runs/{run.pk}/artifacts/{path}").status_code
    page = client.get(f"/runs/{run.pk}/files/{path}").status_code
    return api, page


def test_a_run_folder_that_is_a_link_out_of_the_root_serves_and_lists_nothing(
    viewer, root, run, outside
):
    (root / f"run-{run.pk}").symlink_to(outside, target_is_directory=True)
    assert status_of(viewer, run, "secret.txt") == (404, 404)
    assert status_of(viewer, run, "deeper/secret.txt") == (404, 404)
    assert listed(viewer, run) == []
    page = viewer.get(f"/runs/{run.pk}/").content.decode()
    assert "secret.txt" not in page


def test_a_run_folder_linked_to_the_file_system_root_serves_nothing(viewer, root, run):
    (root / f"run-{run.pk}").symlink_to("/", target_is_directory=True)
    assert status_of(viewer, run, "proc/self/environ") == (404, 404)
    assert status_of(viewer, run, "etc/hostname") == (404, 404)
    assert listed(viewer, run) == []


def test_links_inside_a_run_folder_are_neither_listed_nor_served(viewer, root, run, outside):
    folder = root / f"run-{run.pk}"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "metrics.jsonl").write_bytes(b'{"iteration": 1}\n')
    (folder / "checkpoints" / "iter_000001.pt").write_bytes(b"\0" * 16)
    (folder / "leak.txt").symlink_to(outside / "secret.txt")
    (folder / "linked").symlink_to(outside, target_is_directory=True)
    (folder / "checkpoints" / "iter_000002.pt").symlink_to(outside / "secret.txt")
    # A link that stays inside the folder is refused as well: no link is ever followed.
    (folder / "same.jsonl").symlink_to(folder / "metrics.jsonl")

    assert listed(viewer, run) == ["checkpoints/iter_000001.pt", "metrics.jsonl"]
    download = viewer.get(f"/api/v1/runs/{run.pk}/artifacts/metrics.jsonl")
    assert download.status_code == 200
    assert b"".join(download.streaming_content) == b'{"iteration": 1}\n'
    assert status_of(viewer, run, "checkpoints/iter_000001.pt") == (200, 200)
    for path in ("leak.txt", "linked/secret.txt", "linked/deeper/secret.txt",
                 "checkpoints/iter_000002.pt", "same.jsonl", "../../outside/secret.txt",
                 f"../run-{run.pk}/leak.txt", "checkpoints"):  # fmt: skip
        assert status_of(viewer, run, path) == (404, 404), path
    # No file name: the API's `artifacts/` is its list (paths answer with or without their
    # trailing slash), the page's door serves nothing.
    assert (
        viewer.get(f"/api/v1/runs/{run.pk}/artifacts/").json()
        == viewer.get(f"/api/v1/runs/{run.pk}/artifacts").json()
    )
    assert viewer.get(f"/runs/{run.pk}/files/").status_code == 404


def test_paths_the_operating_system_refuses_are_not_found(viewer, root, run):
    (root / f"run-{run.pk}").mkdir()
    (root / f"run-{run.pk}" / "a").write_bytes(b"a")
    for path in ("a%00b", "%00", "a/%00", "x" * 300, "/".join(["d"] * 3000), "a/b"):
        assert status_of(viewer, run, path) == (404, 404), path[:40]
    assert status_of(viewer, run, "a") == (200, 200)


def test_a_run_without_a_folder_lists_nothing(viewer, root, run):
    assert listed(viewer, run) == []
    assert status_of(viewer, run, "metrics.jsonl") == (404, 404)
