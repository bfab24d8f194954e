"""The admin's password: generated at the first start and shown that once, kept in a
file only its owner can read, stored in the database only as Django's hash, never reset
by a later start; `./armature reset-admin-password` sets a new one."""

import os
import stat
import subprocess
import sys

import pytest
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import identify_hasher
from django.core.management import call_command

from controlplane.core.bootstrap import ensure_admin, reset_admin_password
from controlplane.core.management.commands.up import admin_login_hint

pytestmark = pytest.mark.django_db


@pytest.fixture
def var_dir(settings, tmp_path, monkeypatch):
    settings.VAR_DIR = tmp_path
    monkeypatch.delenv("ARMATURE_ADMIN_PASSWORD", raising=False)
    return tmp_path


def admin():
    return get_user_model().objects.get(username="admin")


def mode_of(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_first_start_generates_a_password_kept_for_its_owner_only(var_dir):
    first = ensure_admin()
    assert first.created and len(first.password) >= 16
    password_file = var_dir / "admin_password"
    assert first.password_file == password_file
    assert password_file.read_text() == first.password
    assert mode_of(password_file) == 0o600
    user = admin()
    assert user.is_superuser and user.is_staff
    assert user.check_password(first.password)
    assert first.password not in user.password  # only the hash is stored
    identify_hasher(user.password)


def test_later_starts_neither_show_nor_reset_the_password(var_dir, monkeypatch):
    first = ensure_admin()
    hashed = admin().password
    (var_dir / "admin_password").write_text("edited-by-hand")
    monkeypatch.setenv("ARMATURE_ADMIN_PASSWORD", "something-else")
    again = ensure_admin()
    assert not again.created and again.password is None
    assert admin().password == hashed
    assert admin().check_password(first.password)


def test_a_password_from_the_environment_is_used_at_the_first_start(var_dir, monkeypatch):
    monkeypatch.setenv("ARMATURE_ADMIN_PASSWORD", "chosen-by-the-operator")
    created = ensure_admin()
    assert created.password == "chosen-by-the-operator"
    assert admin().check_password("chosen-by-the-operator")
    assert not (var_dir / "admin_password").exists()  # whoever set it knows it


def test_up_shows_the_password_only_at_the_start_that_set_it(var_dir):
    first = admin_login_hint(ensure_admin())
    password = (var_dir / "admin_password").read_text()
    assert first == (
        f"log in as admin / {password}; also in {var_dir / 'admin_password'}, readable only by you"
    )
    later = admin_login_hint(ensure_admin())
    assert password not in later
    assert later == f"log in as admin; its password is in {var_dir / 'admin_password'}"


def test_up_without_a_password_file_points_at_the_reset_command(var_dir, monkeypatch):
    monkeypatch.setenv("ARMATURE_ADMIN_PASSWORD", "chosen-by-the-operator")
    ensure_admin()
    later = admin_login_hint(ensure_admin())
    assert "chosen-by-the-operator" not in later
    assert "./armature reset-admin-password" in later


def test_the_reset_command_prints_a_new_password_once_and_keeps_it(var_dir, capsys):
    old = ensure_admin().password
    call_command("reset_admin_password")
    output = capsys.readouterr().out
    new = (var_dir / "admin_password").read_text()
    assert new != old
    assert f"New password for admin: {new}" in output
    assert output.count(new) == 1
    assert mode_of(var_dir / "admin_password") == 0o600
    assert admin().check_password(new) and not admin().check_password(old)


def test_a_reset_creates_a_missing_admin(var_dir):
    account = reset_admin_password()
    assert account.created and admin().check_password(account.password)


def test_a_reset_lifts_the_admins_login_lockout(var_dir, client, settings):
    ensure_admin()
    for _ in range(settings.AXES_FAILURE_LIMIT):
        client.post("/login/", {"username": "admin", "password": "guess"})
    new = reset_admin_password().password
    response = client.post("/login/", {"username": "admin", "password": new})
    assert response.status_code == 302


def test_the_password_file_is_never_readable_by_others_even_with_a_loose_umask(var_dir):
    previous = os.umask(0)
    try:
        ensure_admin()
        assert mode_of(var_dir / "admin_password") == 0o600
        reset_admin_password()
        assert mode_of(var_dir / "admin_password") == 0o600
    finally:
        os.umask(previous)


@pytest.mark.timeout(180)
def test_armature_reset_admin_password_from_the_shell(tmp_path):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "REDIS_URL", "ARMATURE_ADMIN_PASSWORD"}
    }
    env.update(ARMATURE_VAR_DIR=str(tmp_path), ARMATURE_VENV=str(sys.prefix))
    base = django_settings.BASE_DIR
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "-v", "0"], cwd=base, env=env, check=True, timeout=120)
    reset = subprocess.run(
        ["./armature", "reset-admin-password"],
        cwd=base, env=env, check=True, timeout=60, capture_output=True, text=True,
    )  # fmt: skip
    password = (tmp_path / "admin_password").read_text()
    assert f"New password for admin: {password}" in reset.stdout
    assert mode_of(tmp_path / "admin_password") == 0o600
