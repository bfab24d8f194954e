"""docker-compose.yml validates and describes the six services of the production-like
setup (no Docker engine runs here, so rendering it is all that can be checked): it
refuses to render without its secrets, publishes only the web port, keeps the Ray
containers (which run the jobs' code) away from the database, Redis and the control
plane's files, and its settings pass `manage.py check --deploy`."""

import os
import re
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


SECRETS = ("SECRET_KEY", "RAY_AUTH_TOKEN", "POSTGRES_PASSWORD", "REDIS_PASSWORD")


def run_compose(docker_compose: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    inherited = {k: v for k, v in os.environ.items() if k not in SECRETS}
    return subprocess.run(
        [docker_compose, "-f", str(COMPOSE_FILE), *args],
        capture_output=True, text=True, timeout=60, env={**inherited, **env},
    )  # fmt: skip


def compose(docker_compose: str, *args: str) -> str:
    result = run_compose(docker_compose, *args, **dict.fromkeys(SECRETS, "validation-only"))
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
    assert {"postgres-data", "redis-data", "armature-var", "armature-artifacts"} <= set(
        spec["volumes"]
    )
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
        assert not {
            "SECRET_KEY", "DATABASE_URL", "REDIS_URL", "POSTGRES_PASSWORD", "REDIS_PASSWORD"
        } & set(env)  # fmt: skip
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


# --- What the jobs' code can reach ----------------------------------------------------------
# The Ray containers run every job's code. Static checks on the file itself (PyYAML resolves
# its `<<` merge keys), so they hold without docker-compose too.

RAY_SERVICES = ("ray-head", "ray-worker")
CONTROL_PLANE = ("web", "worker")
ARTIFACTS_VOLUME = "armature-artifacts"
VAR_VOLUME = "armature-var"


def compose_spec() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def mounts(service: dict) -> set[tuple[str, str]]:
    """(source, target) of each mount, from the short (`src:dst[:mode]`) or long form."""
    found = set()
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            source, target = volume.split(":")[:2]
        else:
            source, target = volume.get("source", ""), volume["target"]
        found.add((source, target))
    return found


def networks(service: dict) -> set[str]:
    return set(service.get("networks") or ["default"])  # a list or a mapping


def is_under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def required(variable: str) -> str:
    """`${VARIABLE:?message}`: compose refuses to render without the variable."""
    return rf"\$\{{{variable}:\?[^}}]+\}}"


def test_the_ray_containers_mount_the_artifacts_volume_and_nothing_else():
    services = compose_spec()["services"]
    artifacts_dir = services["web"]["environment"]["ARTIFACTS_DIR"]
    for name in RAY_SERVICES:
        assert mounts(services[name]) == {(ARTIFACTS_VOLUME, artifacts_dir)}, name
    # The trainer writes its run folder where web and worker read it: the same path.
    for name in CONTROL_PLANE:
        assert services[name]["environment"]["ARTIFACTS_DIR"] == artifacts_dir
        assert (ARTIFACTS_VOLUME, artifacts_dir) in mounts(services[name])


def test_only_web_and_worker_mount_the_var_volume():
    """It holds the job folders, the static files WhiteNoise serves and pickled caches."""
    services = compose_spec()["services"]
    holders = {name for name, s in services.items() for source, _ in mounts(s)
               if source == VAR_VOLUME}  # fmt: skip
    assert holders == set(CONTROL_PLANE)
    dockerfile = (settings.BASE_DIR / "deploy" / "Dockerfile").read_text()
    var_dir = re.search(r"ARMATURE_VAR_DIR=(\S+)", dockerfile).group(1)
    artifacts_dir = services["web"]["environment"]["ARTIFACTS_DIR"]
    for name in CONTROL_PLANE:
        assert (VAR_VOLUME, var_dir) in mounts(services[name])
        assert "ARMATURE_VAR_DIR" not in services[name]["environment"]
    assert not is_under(artifacts_dir, var_dir) and not is_under(var_dir, artifacts_dir)


def test_beat_keeps_its_schedule_in_no_volume():
    """Beat unpickles its schedule: a file anyone else can write is code the worker runs."""

    def schedule_of(command: list[str]) -> str:
        return command[command.index("--schedule") + 1]

    worker = compose_spec()["services"]["worker"]
    schedule = schedule_of(worker["command"])
    assert not any(is_under(schedule, target) for _, target in mounts(worker))
    k8s = yaml.safe_load((settings.BASE_DIR / "deploy/k8s/worker.yaml").read_text())
    container = k8s["spec"]["template"]["spec"]["containers"][0]
    schedule = schedule_of(container["command"])
    mount_paths = [m["mountPath"] for m in container.get("volumeMounts", [])]
    assert not any(is_under(schedule, path) for path in mount_paths)


def test_postgres_and_redis_share_no_network_with_ray():
    services = compose_spec()["services"]
    ray_networks = set().union(*(networks(services[name]) for name in RAY_SERVICES))
    for name in ("postgres", "redis"):
        assert not networks(services[name]) & ray_networks, name
        for client in CONTROL_PLANE:
            assert networks(services[name]) & networks(services[client]), (name, client)
    # The Jobs API for web and worker, and the trainers' link to ARMATURE_WEB_URL.
    assert services["web"]["environment"]["ARMATURE_WEB_URL"] == "http://web:8000"
    for name in RAY_SERVICES:
        for client in CONTROL_PLANE:
            assert networks(services[name]) & networks(services[client]), (name, client)


def test_the_database_and_redis_passwords_come_from_required_variables():
    services = compose_spec()["services"]
    postgres_password = services["postgres"]["environment"]["POSTGRES_PASSWORD"]
    assert re.fullmatch(required("POSTGRES_PASSWORD"), postgres_password)
    redis = services["redis"]
    command = redis["command"]
    assert re.fullmatch(required("REDIS_PASSWORD"), command[command.index("--requirepass") + 1])
    # The health check authenticates, and only a PONG counts (not a NOAUTH error).
    assert re.fullmatch(required("REDIS_PASSWORD"), redis["environment"]["REDISCLI_AUTH"])
    assert "grep -q PONG" in " ".join(redis["healthcheck"]["test"])
    for name in CONTROL_PLANE:
        env = services[name]["environment"]
        assert re.fullmatch(
            rf"postgres://armature:{required('POSTGRES_PASSWORD')}@postgres:5432/armature",
            env["DATABASE_URL"],
        )
        assert re.fullmatch(
            rf"redis://:{required('REDIS_PASSWORD')}@redis:6379/0", env["REDIS_URL"]
        )


def test_the_rendered_passwords_are_the_given_ones(rendered):
    services = rendered["services"]
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"] == "validation-only"
    command = services["redis"]["command"]
    assert command[command.index("--requirepass") + 1] == "validation-only"
    assert services["redis"]["environment"]["REDISCLI_AUTH"] == "validation-only"
    for name in CONTROL_PLANE:
        env = services[name]["environment"]
        assert env["DATABASE_URL"].startswith("postgres://armature:validation-only@postgres:")
        assert env["REDIS_URL"].startswith("redis://:validation-only@redis:")


def test_the_rendered_file_keeps_the_ray_containers_apart(rendered):
    services = rendered["services"]
    for name in RAY_SERVICES:
        assert {source for source, _ in mounts(services[name])} == {ARTIFACTS_VOLUME}
        assert not networks(services[name]) & (
            networks(services["postgres"]) | networks(services["redis"])
        )


def test_the_ray_pods_get_neither_the_control_plane_secret_nor_its_files():
    """Kubernetes: the `armature` secret holds the database and Redis URLs, passwords
    included, so the Ray pods read only its RAY_AUTH_TOKEN; and a volume they share with
    web or worker (docs/multi-node.md) is the artifacts one, mounted at ARTIFACTS_DIR."""
    k8s = settings.BASE_DIR / "deploy" / "k8s"
    spec = yaml.safe_load((k8s / "raycluster.yaml").read_text())
    ray_pods = [spec["spec"]["headGroupSpec"]["template"]["spec"]] + [
        g["template"]["spec"] for g in spec["spec"]["workerGroupSpecs"]
    ]

    def claims(pod: dict) -> dict[str, str]:
        """Claim name → mount path, over the pod's containers."""
        by_volume = {
            v["name"]: v["persistentVolumeClaim"]["claimName"]
            for v in pod.get("volumes", [])
            if "persistentVolumeClaim" in v
        }
        return {
            by_volume[m["name"]]: m["mountPath"]
            for c in pod["containers"]
            for m in c.get("volumeMounts", [])
            if m["name"] in by_volume
        }

    ray_claims = set()
    for pod in ray_pods:
        for container in pod["containers"]:
            assert "envFrom" not in container
            refs = [
                item["valueFrom"]["secretKeyRef"]["key"]
                for item in container.get("env", [])
                if "secretKeyRef" in item.get("valueFrom", {})
            ]
            assert refs == ["RAY_AUTH_TOKEN"]
        ray_claims |= set(claims(pod))
    for path in ("web.yaml", "worker.yaml"):
        deployment = next(
            doc for doc in yaml.safe_load_all((k8s / path).read_text())
            if doc["kind"] == "Deployment"
        )  # fmt: skip
        pod = deployment["spec"]["template"]["spec"]
        env = {e["name"]: e.get("value") for e in pod["containers"][0].get("env", [])}
        for claim, mount_path in claims(pod).items():
            if claim in ray_claims:
                assert mount_path == env.get("ARTIFACTS_DIR"), (path, claim)
    readme = (k8s / "README.md").read_text()
    assert "--from-literal=REDIS_URL=redis://:" in readme  # with a password
