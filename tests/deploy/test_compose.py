"""docker-compose.yml validates and describes the six services of the production-like
setup (no Docker engine runs here, so validation is all that can be checked)."""

import os
import shutil
import subprocess

import pytest
import yaml
from django.conf import settings

COMPOSE_FILE = settings.BASE_DIR / "docker-compose.yml"
SERVICES = {"postgres", "redis", "web", "worker", "ray-head", "ray-worker"}


@pytest.fixture(scope="module")
def docker_compose() -> str:
    path = shutil.which("docker-compose")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("docker-compose is missing (apt-get install docker-compose)")
        pytest.skip("docker-compose is not installed")
    return path


def compose(docker_compose: str, *args: str) -> str:
    result = subprocess.run(
        [docker_compose, "-f", str(COMPOSE_FILE), *args],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "SECRET_KEY": "validation-only"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_it_validates(docker_compose):
    compose(docker_compose, "config", "-q")


def test_it_lists_the_six_services(docker_compose):
    assert set(compose(docker_compose, "config", "--services").split()) == SERVICES


def test_every_service_has_a_health_check_and_the_data_has_volumes():
    spec = yaml.safe_load(COMPOSE_FILE.read_text())
    assert set(spec["services"]) == SERVICES
    # Services built from the shared anchor inherit its keys through YAML's merge key.
    resolved = {name: {**s.get("<<", {}), **s} for name, s in spec["services"].items()}
    assert [name for name, s in resolved.items() if "healthcheck" not in s] == []
    assert {"postgres-data", "redis-data", "armature-var"} <= set(spec["volumes"])
    for name in ("web", "worker"):
        env = resolved[name]["environment"]
        assert {"DATABASE_URL", "REDIS_URL", "RAY_ADDRESS", "SECRET_KEY"} <= set(env)


def test_the_kubernetes_manifests_wire_web_and_worker_to_the_ray_cluster():
    k8s = settings.BASE_DIR / "deploy" / "k8s"
    docs = {
        (doc["kind"], doc["metadata"]["name"]): doc
        for path in k8s.glob("*.yaml")
        for doc in yaml.safe_load_all(path.read_text())
    }
    assert ("RayCluster", "raycluster-armature") in docs
    assert ("Service", "armature-web") in docs
    for name in ("armature-web", "armature-worker"):
        container = docs["Deployment", name]["spec"]["template"]["spec"]["containers"][0]
        env = {item["name"]: item["value"] for item in container["env"]}
        assert env["RAY_ADDRESS"] == "http://raycluster-armature-head-svc:8265"
        assert container["envFrom"] == [{"secretRef": {"name": "armature"}}]
