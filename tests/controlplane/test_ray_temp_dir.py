"""Ray's temp folder, for `./armature up`'s head and `./armature join`'s node. Ray makes
that folder and all it puts there (the session, sockets/, logs/, runtime_resources/)
world-writable, so it must lie inside a folder only its user can enter: var/ when the
path is short enough for Ray's socket paths, else a folder tempfile.mkdtemp makes under
/tmp, recorded as a link in var/ and checked whenever it is reused."""

import hashlib
import os
import shutil
import socket
import stat
import tempfile
from pathlib import Path

import pytest
from django.core.management.base import CommandError

from controlplane.core import join
from controlplane.core.management.commands.up import ray_temp_dir
from controlplane.core.stack import MAX_RAY_TEMP_DIR_LEN

OTHER_UID = 54321  # nobody's on this machine


@pytest.fixture
def long_var(tmp_path):
    """A var/ folder too deep for Ray's socket paths; the folders made or planted for it
    under /tmp are removed afterwards."""
    var = tmp_path / "a-checkout-too-deep-for-ray-socket-paths" / "var"
    var.mkdir(parents=True, mode=0o700)
    planted: list[Path] = []
    yield var, planted
    for entry in var.iterdir():
        if entry.is_symlink():
            planted.append(Path(os.readlink(entry)).parent)
    for folder in planted:
        if folder.is_symlink():
            folder.unlink()
        elif folder.name.startswith("armature-") and folder.is_dir():
            shutil.rmtree(folder)


def private_folder_in_tmp(name: str) -> Path:
    """A folder as `up` or `join` would make it, whose owner or mode a test then spoils."""
    return Path(tempfile.mkdtemp(prefix=f"{name}-", dir="/tmp"))


def node_dir(var: Path, rank: int = 1) -> Path:
    return join.node_temp_dir({"ARMATURE_VAR_DIR": str(var)}, rank)


def assert_private(folder: Path) -> None:
    status = os.lstat(folder)
    assert stat.S_ISDIR(status.st_mode), f"{folder} is not a folder (or is a link)"
    assert status.st_uid == os.getuid()
    assert stat.S_IMODE(status.st_mode) == 0o700, f"{folder}: {oct(status.st_mode)}"


def test_a_folder_planted_at_the_old_predictable_name_is_not_used(long_var):
    var, planted = long_var
    preferred = var / "ray-node-1"
    digest = hashlib.sha1(str(preferred).encode()).hexdigest()[:10]
    old = Path(tempfile.gettempdir()) / f"armature-ray-node-1-{digest}"  # anyone can compute it
    old.mkdir()
    old.chmod(0o777)
    planted.append(old)

    folder = node_dir(var)
    assert folder != old and old not in folder.parents
    assert_private(folder.parent)


def test_the_folder_made_is_its_users_alone_short_enough_and_reused_by_the_next_start(
    long_var,
):
    var, _ = long_var
    folder = node_dir(var)
    assert_private(folder.parent)
    assert len(str(folder)) <= MAX_RAY_TEMP_DIR_LEN  # Ray's socket paths fit
    assert (var / "ray-node-1").is_symlink()  # recorded: where its logs are
    assert (var / "ray-node-1").resolve() == folder
    folder.chmod(0o777)  # what Ray does to its folder at each start
    assert node_dir(var) == folder  # the next start reuses it


def test_a_recorded_folder_that_is_gone_is_made_anew_under_a_new_name(long_var):
    var, _ = long_var
    gone = private_folder_in_tmp("armature-ray-node-1")
    gone.rmdir()  # /tmp emptied at boot; someone could take the name now
    (var / "ray-node-1").symlink_to(gone / "ray")

    folder = node_dir(var)
    assert gone not in folder.parents
    assert_private(folder.parent)
    assert (var / "ray-node-1").resolve() == folder


def spoiled_by_mode(folder: Path) -> Path:
    folder.chmod(0o777)
    return folder


def spoiled_by_owner(folder: Path) -> Path:
    os.chown(folder, OTHER_UID, -1)
    return folder


def spoiled_by_link(folder: Path) -> Path:
    link = Path(tempfile.mktemp(prefix="armature-ray-node-1-", dir="/tmp"))
    link.symlink_to(folder)
    return link


@pytest.mark.parametrize(
    ("spoil", "reason"),
    [
        (spoiled_by_mode, "has mode 0777, not 0700"),
        (spoiled_by_owner, f"belongs to uid {OTHER_UID}, not to you"),
        (spoiled_by_link, "is a symbolic link"),
    ],
)
def test_a_recorded_folder_that_others_could_enter_or_swap_is_refused(long_var, spoil, reason):
    if spoil is spoiled_by_owner and os.getuid() != 0:
        pytest.skip("giving a folder to another user needs root")
    var, planted = long_var
    folder = private_folder_in_tmp("armature-ray-node-1")
    planted.append(folder)
    recorded = spoil(folder)
    planted.append(recorded)
    (var / "ray-node-1").symlink_to(recorded / "ray")

    with pytest.raises(ValueError, match=reason) as refused:
        node_dir(var)
    assert str(var / "ray-node-1") in str(refused.value)  # what to remove for a new one
    assert not (folder / "ray").exists()  # nothing made inside


def test_a_short_var_folder_is_used_as_is_and_made_private(tmp_path):
    base = Path(tempfile.mkdtemp(dir="/tmp"))  # short: Ray's sockets fit under var/
    try:
        var = base / "var"
        var.mkdir(mode=0o755)
        var.chmod(0o755)  # an older checkout's var/, open to others
        assert node_dir(var) == var / "ray-node-1"
        assert_private(var)
    finally:
        shutil.rmtree(base)


def test_join_refuses_a_temp_dir_inside_a_folder_others_can_enter(capsys, tmp_path):
    with socket.socket() as head:  # the head answers
        head.bind(("127.0.0.1", 0))
        head.listen()
        address = "{}:{}".format(*head.getsockname())
        with pytest.raises(SystemExit) as exited:
            raise SystemExit(
                join.main(
                    [address, "--node-rank", "1", "--token", "t", "--temp-dir", "/tmp/node-1"],
                    {"ARMATURE_VAR_DIR": str(tmp_path)},
                )
            )
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("join: ") and "/tmp" in error and "0700" in error
    assert not Path("/tmp/node-1").exists()


def test_up_refuses_a_recorded_ray_folder_open_to_others(long_var, settings):
    var, planted = long_var
    settings.VAR_DIR = var
    folder = ray_temp_dir()  # the first start makes it
    assert_private(folder.parent)
    assert ray_temp_dir() == folder
    folder.parent.chmod(0o777)
    with pytest.raises(CommandError, match="has mode 0777, not 0700"):
        ray_temp_dir()
