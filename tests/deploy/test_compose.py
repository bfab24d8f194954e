"""docker-compose.yml validates and describes the six services of the production-like
setup (no Docker engine runs here, so rendering it is all that can be checked): it
refuses to render without its secrets, publishes only the web port, and its settings
pass `manage.py check --deploy`."""

import os
import secrets
import shutil
import subprocess
import sys

import pytest
import yaml
from django.conf import settings
from django.test import Client

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


SECRETS = ("SECRET_KEY", "RAY_AUTH_TOKEN")


def run_compose(docker_compose: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    inherited = {k: v for k, v in os.environ.items() if k not in SECRETS}
    return subprocess.run(
        [docker_compose, "-f", str(COMPOSE_FILE), *args],
        capture_output=True, text=True, timeout=60, env={**inherited, **env},
    )  # fmt: skip


def compose(docker_compose: str, *args: str) -> str:
    result = run_compose(
        docker_compose, *args, SECRET_KEY="validation-only", RAY_AUTH_TOKEN="validation-only"
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def rendered(docker_compose) -> dict:
    """The compose file as Docker would run it, with its secrets given."""
    return yaml.safe_load(compose(docker_compose, "config"))


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


def test_every_ray_node_carries_its_own_node_rank(rendered):
    """Placements name node ranks; Ray nodes without the label cannot be placed on."""
    from trainer.cluster.discovery import NODE_RANK_LABEL

    def rank_of(command: list[str]) -> str:
        labels = command[command.index("--labels") + 1]
        return dict(pair.split("=", 1) for pair in labels.split(","))[NODE_RANK_LABEL]

    services = rendered["services"]
    assert [rank_of(services[name]["command"]) for name in ("ray-head", "ray-worker")] == [
        "0", "1"
    ]  # fmt: skip
    k8s = yaml.safe_load((settings.BASE_DIR / "deploy/k8s/raycluster.yaml").read_text())
    head = k8s["spec"]["headGroupSpec"]["rayStartParams"]["labels"]
    groups = k8s["spec"]["workerGroupSpecs"]
    assert head == f"{NODE_RANK_LABEL}=0"
    assert [g["rayStartParams"]["labels"] for g in groups] == [f"{NODE_RANK_LABEL}=1"]
    assert all(g["replicas"] == g["maxReplicas"] == 1 for g in groups)  # one rank, one node


@pytest.mark.parametrize("missing", SECRETS)
def test_it_refuses_to_render_without_each_secret(docker_compose, missing):
    given = {name: "validation-only" for name in SECRETS if name != missing}
    result = run_compose(docker_compose, "config", "-q", **given)
    assert result.returncode != 0
    assert f"Set {missing} to a long random value" in result.stderr
    assert "change-me" not in COMPOSE_FILE.read_text()


def test_only_the_web_port_is_published_on_the_host(rendered):
    published = {name: service.get("ports", []) for name, service in rendered["services"].items()}
    assert {name for name, ports in published.items() if ports} == {"web"}
    assert [str(port.get("target", port)).split(":")[-1] for port in published["web"]] == ["8000"]


def test_ray_requires_its_token_and_gets_no_control_plane_secrets(rendered):
    services = rendered["services"]
    for name in ("ray-head", "ray-worker"):
        env = services[name]["environment"]
        assert env["RAY_AUTH_MODE"] == "token"
        assert env["RAY_AUTH_TOKEN"] == "validation-only"
        # Ray runs the jobs' code: it holds neither Django's key nor the database.
        assert not {"SECRET_KEY", "DATABASE_URL"} & set(env)
    for name in ("web", "worker"):
        assert services[name]["environment"]["RAY_AUTH_TOKEN"] == "validation-only"


def test_manage_check_deploy_is_clean_with_the_compose_settings(rendered, tmp_path):
    web_env = {k: str(v) for k, v in rendered["services"]["web"]["environment"].items()}
    web_env["SECRET_KEY"] = secrets.token_urlsafe(50)  # as the message asks: long, random
    inherited = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DJANGO_", "ARMATURE_", "RAY_")) and k not in web_env
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=120,
        env={**inherited, **web_env, "ARMATURE_VAR_DIR": str(tmp_path)},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


def test_the_one_machine_mode_keeps_plain_http(settings):
    # Plain HTTP on localhost: secure cookies or a redirect to HTTPS would lock users out.
    assert settings.SESSION_COOKIE_SECURE is False
    assert settings.SECURE_SSL_REDIRECT is False
    assert settings.SECURE_HSTS_SECONDS == 0


def test_the_ray_pods_require_the_token_the_web_and_worker_pods_hold():
    spec = yaml.safe_load((settings.BASE_DIR / "deploy" / "k8s" / "raycluster.yaml").read_text())
    head = spec["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    workers = [g["template"]["spec"]["containers"][0] for g in spec["spec"]["workerGroupSpecs"]]
    for container in [head, *workers]:
        env = {item["name"]: item for item in container["env"]}
        assert env["RAY_AUTH_MODE"]["value"] == "token"
        assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {
            "name": "armature",
            "key": "RAY_AUTH_TOKEN",
        }
    readme = (settings.BASE_DIR / "deploy" / "k8s" / "README.md").read_text()
    assert "--from-literal=RAY_AUTH_TOKEN=" in readme  # the secret web and worker load


@pytest.mark.django_db
def test_behind_the_tls_proxy_https_is_enforced_and_probes_still_get_in(settings):
    # The settings docker-compose.yml turns on (controlplane/settings.py reads them).
    settings.SECURE_SSL_REDIRECT = True
    settings.SESSION_COOKIE_SECURE = settings.CSRF_COOKIE_SECURE = True
    settings.SECURE_HSTS_SECONDS = 31536000
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    client = Client()  # built after the settings: the middleware reads them once
    plain = client.get("/login/")
    assert plain.status_code == 301 and plain["Location"] == "https://testserver/login/"
    proxied = client.get("/login/", headers={"X-Forwarded-Proto": "https"})
    assert proxied.status_code == 200
    assert proxied["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains; preload"
    assert proxied.cookies["csrftoken"]["secure"] is True
    assert client.get("/healthz").status_code in (200, 503)  # answered, not redirected
