"""Settings come from environment variables, with one-machine defaults."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

pytestmark = pytest.mark.embedded

PROBE = """
import json, django
django.setup()
from django.conf import settings as s

print(json.dumps({
    "engine": s.DATABASES["default"]["ENGINE"],
    "db_name": str(s.DATABASES["default"]["NAME"]),
    "broker": s.CELERY_BROKER_URL,
    "results": s.CELERY_RESULT_BACKEND,
    "layer": s.CHANNEL_LAYERS["default"]["BACKEND"],
    "layer_config": s.CHANNEL_LAYERS["default"].get("CONFIG"),
    "secret": s.SECRET_KEY,
    "debug": s.DEBUG,
    "hosts": s.ALLOWED_HOSTS,
    "ray": s.RAY_ADDRESS,
}))
"""

CONTROLLED = ("DATABASE_URL", "REDIS_URL", "RAY_ADDRESS", "SECRET_KEY", "DEBUG", "ALLOWED_HOSTS")


def load_settings(var_dir, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in CONTROLLED}
    clean.update(
        DJANGO_SETTINGS_MODULE="controlplane.settings", ARMATURE_VAR_DIR=str(var_dir), **env
    )
    result = subprocess.run(
        [sys.executable, "-c", PROBE], env=clean, capture_output=True, text=True,
        cwd=settings.BASE_DIR, timeout=60,
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(result.stderr)
    return json.loads(result.stdout)


def test_it_defaults_to_the_one_machine_mode(tmp_path):
    loaded = load_settings(tmp_path)
    assert loaded["engine"] == "django.db.backends.sqlite3"
    assert loaded["db_name"] == str(tmp_path / "armature.sqlite3")
    assert loaded["broker"] == "filesystem://"
    assert loaded["results"].endswith(f"+file://{tmp_path}/broker/results")
    assert loaded["layer"] == "channels.layers.InMemoryChannelLayer"
    assert loaded["debug"] is False
    assert loaded["ray"] == "http://127.0.0.1:8265"
    assert (tmp_path / "broker" / "queue").is_dir()


def test_it_keeps_the_generated_secret_key_across_starts(tmp_path):
    first = load_settings(tmp_path)["secret"]
    assert len(first) >= 50
    assert load_settings(tmp_path)["secret"] == first
    assert (tmp_path / "secret_key").stat().st_mode & 0o777 == 0o600


def test_it_uses_postgresql_when_database_url_is_set(tmp_path):
    loaded = load_settings(tmp_path, DATABASE_URL="postgres://someone@db.example:5433/armature")
    assert loaded["engine"] == "django.db.backends.postgresql"
    assert loaded["db_name"] == "armature"


def test_it_uses_redis_for_broker_results_and_channels_when_redis_url_is_set(tmp_path):
    loaded = load_settings(tmp_path, REDIS_URL="redis://127.0.0.1:6379/3")
    assert loaded["broker"] == loaded["results"] == "redis://127.0.0.1:6379/3"
    assert loaded["layer"] == "channels_redis.core.RedisChannelLayer"
    assert loaded["layer_config"] == {
        "hosts": [{"address": "redis://127.0.0.1:6379/3"}],
        "capacity": 2000,  # shared by all of a web process's consumers
    }


def test_it_reads_secret_debug_hosts_and_ray_address(tmp_path):
    loaded = load_settings(
        tmp_path, SECRET_KEY="s3cret", DEBUG="yes", ALLOWED_HOSTS="a.example, b.example",
        RAY_ADDRESS="http://ray-head:8265",
    )  # fmt: skip
    assert loaded["secret"] == "s3cret"
    assert loaded["debug"] is True
    assert loaded["hosts"] == ["a.example", "b.example"]
    assert loaded["ray"] == "http://ray-head:8265"
    assert not (tmp_path / "secret_key").exists()


def test_it_names_a_bad_boolean(tmp_path):
    with pytest.raises(RuntimeError, match=r"DEBUG='maybe' is not a boolean"):
        load_settings(tmp_path, DEBUG="maybe")


def test_artifacts_dir_takes_a_path_or_a_file_uri_and_names_what_it_cannot_use(tmp_path):
    from controlplane.env import artifacts_dir

    default = tmp_path / "var" / "artifacts"
    assert artifacts_dir("", default) == default
    assert artifacts_dir("/mnt/nfs/armature", default) == Path("/mnt/nfs/armature")
    assert artifacts_dir("file:///mnt/nfs/my%20runs", default) == Path("/mnt/nfs/my runs")
    with pytest.raises(ValueError, match="mount an object store"):
        artifacts_dir("s3://bucket/runs", default)


def test_a_secret_file_left_empty_is_replaced_and_a_draft_never_counts(tmp_path):
    """A start killed between creating the secret's file and writing it must not leave
    an empty secret in force (an empty Ray token turns the head's checks off)."""
    from controlplane.env import persistent_secret

    path = tmp_path / "ray_auth_token"
    path.write_text("")
    (tmp_path / ".ray_auth_token.draft").write_text("")  # an interrupted write's draft
    secret = persistent_secret(path)
    assert len(secret) >= 50 and path.read_text() == secret
    assert path.stat().st_mode & 0o777 == 0o600
    assert persistent_secret(path) == secret  # kept across starts
    assert sorted(p.name for p in tmp_path.iterdir()) == [".ray_auth_token.draft", path.name]
