"""Rejecting a 600-byte YAML alias bomb ("billion laughs", ~3e10 nodes expanded) at each
door that reads YAML, against the same door rejecting 600 bytes of plainly invalid YAML
(an unclosed bracket), timed in the same run through Django's test client (the whole
request: middleware, access check, view, bounded reader, template or JSON).

Doors: the cluster validate fragment (`/cluster/validate/`), the placement preview API,
an experiment revision saved through the API, and the cluster import page. Before the
bounded reader, the bomb kept a web thread busy for minutes at each of them.

It migrates an SQLite database in a temporary folder and needs no server.

    python bench/hostile_input.py [--repeats 9]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.hostile_yaml import ALIAS_BOMB, PLAINLY_INVALID  # noqa: E402

CONFIG = (ROOT / "examples/builtin_ppo.yaml").read_text()


def set_up(var_dir: Path):
    """Migrate, create an admin and the experiment `bench`; return a logged-in client."""
    os.environ.update(
        ARMATURE_VAR_DIR=str(var_dir),
        DJANGO_SETTINGS_MODULE="controlplane.settings",
        ALLOWED_HOSTS="testserver",
        DATABASE_URL=f"sqlite:///{var_dir / 'bench.sqlite3'}",
    )
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group
    from django.core.management import call_command
    from django.test import Client

    from controlplane.experiments.services import create_experiment

    call_command("migrate", verbosity=0)
    logging.disable(logging.WARNING)  # not a "Bad Request" line per refused request
    admin = get_user_model().objects.create_user("bench-admin")
    admin.groups.add(Group.objects.get_or_create(name="admin")[0])
    create_experiment("bench", CONFIG, author=admin)
    client = Client()
    client.force_login(admin)
    return client


def doors(client) -> dict[str, Callable[[str], object]]:
    def api(path: str, field: str, extra: dict | None = None) -> Callable[[str], object]:
        def post(text: str) -> object:
            body = json.dumps({**(extra or {}), field: text})
            return client.post(path, body, content_type="application/json")

        return post

    return {
        "cluster_validate_page": lambda text: client.post(
            "/cluster/validate/", {"yaml_text": text}, HTTP_HX_REQUEST="true"
        ),
        "placement_preview_api": api("/api/v1/placement/preview", "cluster_yaml"),
        "experiment_revision_api": api("/api/v1/experiments/bench/revisions", "config_yaml"),
        "cluster_import_page": lambda text: client.post(
            "/cluster/", {"name": "hostile", "yaml_text": text}
        ),
    }


def median_rejection_s(send: Callable[[str], object], text: str, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        response = send(text)
        times.append(time.perf_counter() - start)
        assert response.status_code in (400, 422), response.status_code
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    assert len(ALIAS_BOMB.encode()) == len(PLAINLY_INVALID.encode()) == 600
    with tempfile.TemporaryDirectory(prefix="armature-bench-") as folder:
        client = set_up(Path(folder))
        results = {}
        for door, send in doors(client).items():
            refused = send(ALIAS_BOMB)
            assert b"expands to more than" in refused.content, refused.content[:300]
            send(PLAINLY_INVALID)  # warm both paths (templates, imports) before timing
            bomb_s = median_rejection_s(send, ALIAS_BOMB, args.repeats)
            invalid_s = median_rejection_s(send, PLAINLY_INVALID, args.repeats)
            results[door] = (bomb_s, invalid_s)
    print(f"600-byte documents, median of {args.repeats} requests per door and document")
    print(f"{'door':<26} {'alias bomb':>12} {'invalid YAML':>13} {'ratio':>6}")
    for door, (bomb_s, invalid_s) in results.items():
        ratio = bomb_s / invalid_s
        print(f"{door:<26} {bomb_s * 1e3:>9.2f} ms {invalid_s * 1e3:>10.2f} ms {ratio:>6.2f}")
    for door, (bomb_s, invalid_s) in results.items():
        print(
            f"RESULT bench=hostile_input_{door} ours={bomb_s * 1e3:.3f} "
            f"baseline={invalid_s * 1e3:.3f} ratio={bomb_s / invalid_s:.3f} unit=ms better=lower"
        )
    worst_bomb = max(bomb_s for bomb_s, _ in results.values())
    worst_invalid = max(invalid_s for _, invalid_s in results.values())
    print(
        f"RESULT bench=hostile_input ours={worst_bomb * 1e3:.3f} "
        f"baseline={worst_invalid * 1e3:.3f} ratio={worst_bomb / worst_invalid:.3f} "
        "unit=ms better=lower"
    )


if __name__ == "__main__":
    main()
