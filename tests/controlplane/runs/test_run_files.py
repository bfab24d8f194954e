"""A run's files over the API and the run page: only what really lies inside the run's
own folder under the artifacts root is listed or served. A run folder, sub-folder or
file that is a symbolic link (a job on shared storage can make one) is refused, and a
path the operating system cannot even look up is a 404, not a 500. Files go out as
opaque attachments under a policy of their own, whatever their names say; names with
control characters, or that are not text, are neither listed nor served, and the run
page shows the others."""

import os

import pytest
from django.contrib.auth import get_user_model

from tests.asgi_fetch import fetch_through_asgi
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
    assert b"".join(download) == b'{"iteration": 1}\n'
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


def downloads(client, run, path: str):
    """The API's and the run page's answers for one file."""
    return (
        client.get(f"/api/v1/runs/{run.pk}/artifacts/{path}"),
        client.get(f"/runs/{run.pk}/files/{path}"),
    )


def test_files_are_served_as_opaque_attachments_under_a_sandbox(viewer, root, run):
    folder = root / f"run-{run.pk}"
    (folder / "sub").mkdir(parents=True)
    written = {
        "x.js": b"alert(document.cookie)\n",
        "x.html": b"<script>alert(1)</script>\n",
        "x.svg": b'<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>',
        "sub/x.js": b"fetch('/api/v1/runs')\n",
    }
    for path, content in written.items():
        (folder / path).write_bytes(content)
    for path, content in written.items():
        for response in downloads(viewer, run, path):
            assert response.status_code == 200, path
            assert response["Content-Type"] == "application/octet-stream", path
            name = path.rpartition("/")[2]
            assert response["Content-Disposition"] == f'attachment; filename="{name}"'
            assert response["Content-Security-Policy"] == "sandbox; default-src 'none'"
            assert response["X-Content-Type-Options"] == "nosniff"
            assert b"".join(response) == content
    # The pages keep their own policy.
    page = viewer.get(f"/runs/{run.pk}/")
    assert "sandbox" not in page["Content-Security-Policy"]
    assert "script-src 'self'" in page["Content-Security-Policy"]


def test_names_with_control_characters_are_left_out_and_the_page_still_renders(viewer, root, run):
    folder = root / f"run-{run.pk}"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "metrics.jsonl").write_bytes(b"{}\n")
    (folder / "checkpoints" / "iter_000001.pt").write_bytes(b"w")
    strange = ["a\nb", "tab\tbed", "bell\x07", "del\x7f", "cr\rlf"]
    for name in strange:
        (folder / name).write_bytes(SECRET)
    (folder / "line\nfolder").mkdir()
    (folder / "line\nfolder" / "inside.txt").write_bytes(SECRET)
    os.mkdir(os.fsencode(folder) + b"/bytes\xff")  # not text: undecodable bytes
    with open(os.fsencode(folder) + b"/bytes\xff/inside.txt", "wb") as file:
        file.write(SECRET)
    with open(os.fsencode(folder) + b"/name\xfe.txt", "wb") as file:
        file.write(SECRET)

    assert listed(viewer, run) == ["checkpoints/iter_000001.pt", "metrics.jsonl"]
    page = viewer.get(f"/runs/{run.pk}/")
    assert page.status_code == 200
    files = page.content.decode().split('id="run-files"')[1].split("</section>")[0]
    assert '<tr data-path="metrics.jsonl">' in files
    assert '<tr data-path="checkpoints/iter_000001.pt">' in files
    assert files.count("<tr data-path=") == 2
    for name in [*strange, "line\nfolder/inside.txt"]:
        quoted = "".join(c if c.isalnum() else f"%{ord(c):02X}" for c in name)
        assert status_of(viewer, run, quoted) == (404, 404), name
    assert status_of(viewer, run, "bytes%FF/inside.txt") == (404, 404)
    assert status_of(viewer, run, "metrics.jsonl") == (200, 200)


def test_a_large_file_is_streamed_a_chunk_at_a_time(viewer, root, run):
    """Through Django's ASGI handler, as daphne serves it: a 96 MiB checkpoint costs the
    web server a few chunks, not the file."""
    size = 96 * 2**20
    folder = root / f"run-{run.pk}" / "checkpoints"
    folder.mkdir(parents=True)
    with open(folder / "iter_000001.pt", "wb") as big:
        big.truncate(size)  # sparse: no 96 MiB written to disk
    cookie = f"sessionid={viewer.cookies['sessionid'].value}"
    for path in (f"/runs/{run.pk}/files/checkpoints/iter_000001.pt",
                 f"/api/v1/runs/{run.pk}/artifacts/checkpoints/iter_000001.pt"):  # fmt: skip
        fetched = fetch_through_asgi(path, "", {"Cookie": cookie})
        assert fetched.status == 200 and fetched.size == size, path
        assert fetched.headers["content-length"] == str(size)
        assert fetched.peak < size // 10, f"{path} held {fetched.peak / 2**20:.0f} MiB"
