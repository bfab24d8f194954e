"""Hostile input at every door that reads YAML (and JSON bodies): a 600-byte alias bomb,
nesting 10,000 levels deep, an integer too long to convert, NaN and infinity, bodies
past the size limit, unicode names. Each is refused with a clear error (400/413/422),
never a 500, and never after minutes of a web thread's time. The trainer link's door
too: whatever its parser accepts is stored, and every page showing it answers."""

import json

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.files.uploadedfile import SimpleUploadedFile
from hypothesis import HealthCheck, event, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from controlplane.experiments.models import Experiment
from controlplane.experiments.services import create_experiment
from controlplane.inventory.models import Cluster
from controlplane.inventory.services import import_cluster_yaml
from controlplane.runs import telemetry
from tests.hostile_yaml import ALIAS_BOMB, DEEP_NESTING, deep_nesting
from tests.runs import submitted_run
from trainer.link.protocol import EVENT_KINDS, MAX_WALL_TIME

# Hang guard only: before the limits, the alias bomb kept a request busy for minutes.
pytestmark = [pytest.mark.django_db, pytest.mark.timeout(120)]

TWO_NODES = (settings.BASE_DIR / "examples/clusters/two_nodes.yaml").read_text()
CONFIG = (settings.BASE_DIR / "examples/builtin_ppo.yaml").read_text()
BOMB_SAYS = "expands to more than 100000 nodes"
DEEP_SAYS = "nests deeper than 64 levels"
HOSTILE = [pytest.param(ALIAS_BOMB, BOMB_SAYS, id="alias-bomb"),
           pytest.param(DEEP_NESTING, DEEP_SAYS, id="deep-nesting")]  # fmt: skip


@pytest.fixture
def admin():
    user = get_user_model().objects.create_user("ada")
    user.groups.add(Group.objects.get_or_create(name="admin")[0])
    return user


@pytest.fixture
def page(client, admin):
    client.force_login(admin)
    return client


@pytest.fixture
def api(admin) -> APIClient:
    client = APIClient()
    client.force_authenticate(admin)
    return client


@pytest.fixture
def lab():
    return import_cluster_yaml("lab", TWO_NODES)


@pytest.fixture
def experiment(admin):
    return create_experiment("reach", CONFIG, author=admin)


# ---- pages -------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "says"), HOSTILE)
def test_cluster_import_page_refuses(page, text, says):
    response = page.post("/cluster/", {"name": "bomb", "yaml_text": text})
    assert response.status_code == 422
    assert says in response.content.decode()
    assert not Cluster.objects.filter(name="bomb").exists()


@pytest.mark.parametrize(("text", "says"), HOSTILE)
def test_cluster_import_page_refuses_an_uploaded_file(page, text, says):
    upload = SimpleUploadedFile("bomb.yaml", text.encode(), content_type="text/yaml")
    response = page.post("/cluster/", {"name": "bomb", "yaml_file": upload})
    assert response.status_code == 422
    assert says in response.content.decode()


def test_cluster_import_page_refuses_a_file_past_the_size_limit(page, monkeypatch):
    monkeypatch.setenv("ARMATURE_YAML_MAX_BYTES", "1000")
    upload = SimpleUploadedFile("big.yaml", TWO_NODES.encode() + b"#" * 1000)
    response = page.post("/cluster/", {"name": "big", "yaml_file": upload})
    assert response.status_code == 422
    assert (
        f"The file is {len(TWO_NODES) + 1000} bytes; a cluster file may have at most 1000 "
        "bytes (setting ARMATURE_YAML_MAX_BYTES)." in response.content.decode()
    )


@pytest.mark.parametrize(("text", "says"), HOSTILE)
def test_cluster_edit_page_refuses(page, lab, text, says):
    response = page.post("/cluster/lab/edit/", {"yaml_text": text})
    assert response.status_code == 422
    assert says in response.content.decode()
    assert Cluster.objects.get(name="lab").num_nodes == 2


@pytest.mark.parametrize(("text", "says"), HOSTILE)
def test_cluster_validate_fragment_refuses(page, text, says):
    response = page.post("/cluster/validate/", {"yaml_text": text}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200  # htmx's: the issues in the fragment, no 4xx logged
    body = response.content.decode()
    assert says in body and "yaml.limit" in body


@pytest.mark.parametrize(("text", "says"), HOSTILE)
def test_placement_preview_fragment_refuses(page, lab, text, says):
    response = page.post("/cluster/lab/placement/preview/", {"placement": text})
    assert response.status_code == 422
    assert says in response.content.decode()


@pytest.mark.parametrize(("text", "says"), HOSTILE)
def test_experiment_pages_refuse(page, experiment, text, says):
    created = page.post("/experiments/", {"name": "bomb", "config_yaml": text})
    assert created.status_code == 422
    assert says in created.content.decode()
    assert not Experiment.objects.filter(name="bomb").exists()
    revised = page.post("/experiments/reach/", {"config_yaml": text})
    assert revised.status_code == 422
    assert says in revised.content.decode()
    assert experiment.revisions.count() == 1
    checked = page.post("/experiments/validate/", {"config_yaml": text})
    assert checked.status_code == 422
    assert says in checked.content.decode()


# ---- API ---------------------------------------------------------------------------


def only_error(response) -> dict:
    assert response.status_code == 400, response.content
    (error,) = response.json()["errors"]
    return error


@pytest.mark.parametrize(("text", "says"), HOSTILE)
def test_cluster_api_refuses(api, lab, text, says):
    created = api.post("/api/v1/clusters", {"name": "bomb", "yaml": text}, format="json")
    assert only_error(created)["rule"] == "yaml.limit"
    assert says in only_error(created)["message"]
    replaced = api.put("/api/v1/clusters/lab", {"name": "lab", "yaml": text}, format="json")
    assert says in only_error(replaced)["message"]


@pytest.mark.parametrize(("text", "says"), HOSTILE)
def test_placement_preview_api_refuses_cluster_yaml_and_placement_text(api, lab, text, says):
    inline = api.post("/api/v1/placement/preview", {"cluster_yaml": text}, format="json")
    assert says in only_error(inline)["message"]
    placement = api.post(
        "/api/v1/placement/preview", {"cluster": "lab", "placement": text}, format="json"
    )
    assert says in only_error(placement)["message"]


@pytest.mark.parametrize(("text", "says"), HOSTILE)
def test_experiment_api_refuses(api, experiment, text, says):
    created = api.post("/api/v1/experiments", {"name": "bomb", "config_yaml": text}, format="json")
    assert says in only_error(created)["message"]
    revised = api.post("/api/v1/experiments/reach/revisions", {"config_yaml": text}, format="json")
    assert says in only_error(revised)["message"]


@pytest.mark.parametrize(
    ("text", "says"), [(ALIAS_BOMB, BOMB_SAYS), (deep_nesting(100), DEEP_SAYS)]
)
def test_run_api_refuses_a_hostile_override(api, experiment, text, says):
    override = "algorithm.extra=" + text
    launched = api.post(
        "/api/v1/runs", {"experiment": "reach", "overrides": [override]}, format="json"
    )
    assert says in only_error(launched)["message"]


def test_a_json_body_nested_past_the_limit_is_a_400_not_a_500(api):
    for depth in (100, 100_000):  # under and over Python's own recursion limit
        body = '{"name": "deep", "config": ' + "[" * depth + "]" * depth + "}"
        response = api.post("/api/v1/clusters", body, content_type="application/json")
        assert response.status_code == 400
        assert "nests deeper than 64 levels" in response.json()["detail"]


# ---- numbers -----------------------------------------------------------------------


def test_huge_numbers_are_a_400_not_a_500(api, lab):
    huge = "1" + "0" * 5000
    config = api.post(
        "/api/v1/experiments", {"name": "huge", "config_yaml": f"runner:\n  iterations: {huge}\n"},
        format="json",
    )  # fmt: skip
    assert "Exceeds the limit (4300 digits)" in only_error(config)["message"]
    cluster = api.post(
        "/api/v1/clusters", {"name": "huge", "yaml": f"cluster:\n  num_nodes: {huge}\n"},
        format="json",
    )  # fmt: skip
    assert only_error(cluster)["rule"] == "yaml.limit"
    text = "cluster:\n  num_nodes: 1000000000000\n"
    error = only_error(api.post("/api/v1/clusters", {"name": "big", "yaml": text}, format="json"))
    assert "exceeds the supported maximum" in error["message"]


@pytest.mark.parametrize("number", [".nan", ".inf", "-.inf", "1e400"])
def test_nan_and_infinity_are_refused_where_a_finite_number_is_expected(api, number):
    response = api.post(
        "/api/v1/experiments",
        {"name": "nan", "config_yaml": f"actor:\n  learning_rate: {number}\n"},
        format="json",
    )
    error = only_error(response)
    assert (error["path"], error["message"]) == (
        "actor.learning_rate", "Input should be a finite number"
    )  # fmt: skip


# ---- the cluster: section of an experiment config ----------------------------------


def test_a_revision_with_a_broken_cluster_section_is_refused_with_key_paths(api, experiment):
    config = CONFIG + "cluster:\n  num_nodes: 1\n  component_placement:\n    actor: 0-3\n"
    response = api.post(
        "/api/v1/experiments/reach/revisions", {"config_yaml": config}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["errors"][0]["path"] == "cluster.component_placement.actor"
    assert experiment.revisions.count() == 1


def test_the_experiment_page_shows_cluster_section_errors_by_key_path(page, experiment):
    config = CONFIG + "cluster:\n  num_nodes: two\n"
    response = page.post("/experiments/reach/", {"config_yaml": config})
    assert response.status_code == 422
    assert "cluster.num_nodes" in response.content.decode()


# ---- body size ---------------------------------------------------------------------


def test_an_api_body_past_the_limit_gets_413_in_json(api, settings):
    settings.MAX_REQUEST_BYTES = 10_000
    body = {"name": "big", "config_yaml": CONFIG + "#" * 10_000}
    response = api.post("/api/v1/experiments", body, format="json")
    assert response.status_code == 413
    assert response.json()["detail"].startswith("The request body is ")
    assert "the limit is 10000 bytes" in response.json()["detail"]
    assert "ARMATURE_MAX_REQUEST_BYTES" in response.json()["detail"]


def test_a_page_body_past_the_limit_gets_a_readable_413(page, settings):
    settings.MAX_REQUEST_BYTES = 10_000
    response = page.post("/experiments/", {"name": "big", "config_yaml": "#" * 20_000})
    assert response.status_code == 413
    body = response.content.decode()
    assert "<h1>Too large</h1>" in body and "the limit is 10000 bytes" in body
    fragment = page.post("/cluster/validate/", {"yaml_text": "#" * 20_000}, HTTP_HX_REQUEST="true")
    assert fragment.status_code == 413
    assert fragment.content.decode().startswith('<p class="error" role="alert">')


# ---- unicode names -----------------------------------------------------------------


def test_unicode_names_are_kept_and_unstorable_text_is_refused(api):
    config = CONFIG.replace("name: builtin-ppo", "name: 把手 🤖")
    body = {"name": "ロボット", "config_yaml": config}
    assert "name" in api.post("/api/v1/experiments", body, format="json").json()  # a slug
    kept = api.post("/api/v1/experiments", {"name": "reach", "config_yaml": config}, format="json")
    assert kept.status_code == 201
    revisions = api.get("/api/v1/experiments/reach/revisions").json()["results"]
    assert "把手 🤖" in revisions[0]["config_yaml"]
    labelled = TWO_NODES.replace("label: gpu", "label: gpu-ü")
    cluster = api.post("/api/v1/clusters", {"name": "lab", "yaml": labelled}, format="json")
    assert cluster.status_code == 201
    assert cluster.json()["node_groups"][0]["label"] == "gpu-ü"
    # NUL and lone surrogates, as YAML escapes and as JSON escapes
    nul = TWO_NODES.replace("label: gpu", 'label: "gpu\\0"')
    refused = only_error(api.post("/api/v1/clusters", {"name": "n", "yaml": nul}, format="json"))
    assert "a NUL character (U+0000 at character 4)" in refused["message"]
    assert refused["line"] == 18
    for escape in ("\\u0000", "\\ud800"):
        group = '{"label": "g' + escape + '", "node_ranks": "0"}'
        raw = '{"name": "n", "config": {"num_nodes": 1, "node_groups": [' + group + "]}}"
        response = api.post("/api/v1/clusters", raw, content_type="application/json")
        assert response.status_code == 400
        assert "cannot be stored" in response.json()["detail"]


def test_a_value_longer_than_its_column_is_refused_with_its_key_path(api):
    long_label = TWO_NODES.replace("label: gpu", "label: " + "g" * 101)
    body = {"name": "l", "yaml": long_label}
    error = only_error(api.post("/api/v1/clusters", body, format="json"))
    assert (error["rule"], error["location"], error["line"]) == (
        "storage.too_long", "cluster.node_groups[0].label", 18
    )  # fmt: skip
    assert error["message"] == "101 characters; at most 100 can be stored"
    assert not Cluster.objects.exists()


@hypothesis_settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(label=st.text(min_size=1, max_size=120))
def test_any_node_group_label_is_stored_as_sent_or_refused_with_a_400(admin, label):
    api = APIClient()
    api.force_authenticate(admin)
    config = {"num_nodes": 1, "node_groups": [{"label": label, "node_ranks": "0"}]}
    body = json.dumps({"name": "fuzz", "config": config})  # escapes surrogates as \\udxxx
    response = api.post("/api/v1/clusters", body, content_type="application/json")
    assert response.status_code in (201, 400), response.content
    if response.status_code == 201:
        assert response.json()["node_groups"][0]["label"] == label


# ---- the trainer link --------------------------------------------------------------

# Messages as a trainer may send them (text a database stores, markup and emoji
# included; safe metric keys up to their length limit; numbers in range; nesting up to
# the limit), and hostile ones, where any part may be anything: NUL and lone surrogates
# (json.dumps writes them as \\u0000, \\udcff), NaN and infinities (written as NaN,
# Infinity), huge integers, deep nesting, unsafe keys, unknown kinds.
STORABLE_TEXT = st.text(
    st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=12
)
ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=12)
UNSTORABLE_TEXT = st.builds(
    lambda before, bad, after: before + bad + after,
    STORABLE_TEXT, st.sampled_from(["\x00", "\ud800", "\udcff", "\udfff"]), STORABLE_TEXT,
)  # fmt: skip
HOSTILE_TEXT = st.one_of(STORABLE_TEXT, UNSTORABLE_TEXT, ANY_TEXT)
SAFE_KEYS = st.one_of(
    st.from_regex(r"[A-Za-z0-9_./:-]{1,20}", fullmatch=True),
    st.sampled_from(["rollout/success_rate", "counts/task3/h5/episodes", "k" * 200]),
)
KEYS = st.one_of(
    SAFE_KEYS, HOSTILE_TEXT,
    st.sampled_from(["", "k" * 201, "a b", "counts/task<img src=x onerror=alert(1)>/episodes"]),
)  # fmt: skip
FINITE = st.one_of(
    st.integers(-(2**63) + 1, 2**63 - 1), st.floats(allow_nan=False, allow_infinity=False)
)
NUMBERS = st.one_of(
    FINITE,
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.sampled_from([1e18, 2**63, -1, MAX_WALL_TIME + 1]),
)
WALL_TIME = st.floats(0, MAX_WALL_TIME)
COUNT = st.integers(0, 2**31 - 1)


def nested(depth: int) -> dict:
    data: dict = {"leaf": 1}
    for _ in range(depth):
        data = {"a": data}
    return data


def link_messages(text, metric_keys, data_keys, number, wall_time, count, seq, kinds, depth):
    """Messages of the link's three types, and anything at all, made of these parts."""
    data_json = st.recursive(
        st.none() | st.booleans() | number | text,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(data_keys, inner, max_size=3),
        max_leaves=12,
    )
    values = st.dictionaries(metric_keys, number, min_size=1, max_size=6)
    takeover = st.fixed_dictionaries({
        "operator": text.filter(bool), "robot": count, "robot_name": text,
        "started": wall_time, "ended": wall_time, "steps": count, "reason": text,
    })  # fmt: skip
    data = st.one_of(
        st.dictionaries(data_keys, data_json, max_size=4),
        depth.map(nested),
    )
    return st.one_of(
        st.fixed_dictionaries({
            "v": st.just(1), "type": st.just("metrics"), "seq": seq, "step": count,
            "time": wall_time, "values": values,
        }),
        st.fixed_dictionaries({
            "v": st.just(1), "type": st.just("progress"), "seq": seq, "step": count,
            "total": count,
        }).map(lambda m: {**m, "total": max(m["step"], m["total"])}),
        st.fixed_dictionaries({
            "v": st.just(1), "type": st.just("event"), "seq": seq, "kind": kinds, "data": data,
        }),
        st.fixed_dictionaries({
            "v": st.just(1), "type": st.just("event"), "seq": seq, "kind": st.just("finished"),
            "data": values.map(lambda summary: {"summary": summary}),
        }),
        st.fixed_dictionaries({
            "v": st.just(1), "type": st.just("event"), "seq": seq, "kind": st.just("takeover"),
            "data": takeover.map(
                lambda t: {**t, "ended": max(t["started"], t["ended"])}
            ),
        }),
    )  # fmt: skip


TRAINER_MESSAGES = link_messages(
    text=STORABLE_TEXT, metric_keys=SAFE_KEYS, data_keys=STORABLE_TEXT, number=FINITE,
    wall_time=WALL_TIME, count=COUNT, seq=st.integers(1, 2**63 - 1),
    kinds=st.sampled_from(["started", "placed", "model", "iteration", "checkpoint", "recovered",
                           "stopped", "failed"]),
    depth=st.integers(1, 60),
)  # fmt: skip
HOSTILE_PARTS = st.one_of(
    UNSTORABLE_TEXT, HOSTILE_TEXT, NUMBERS, st.integers(60, 90).map(nested),
    st.sampled_from([None, True, [], {}, "", "k" * 201, 2**63, 1e18, -1]),
)  # fmt: skip


def _places(value, found: list) -> list:
    """Every (container, key or index) of a message, at any depth."""
    if isinstance(value, dict | list):
        for key in list(value) if isinstance(value, dict) else range(len(value)):
            found.append((value, key))
            _places(value[key], found)
    return found


@st.composite
def one_part_hostile(draw) -> dict:
    """A message a trainer may send with one part made hostile: a value anywhere, or a
    key (the key of a metric, of event data, or of the message itself)."""
    message = draw(TRAINER_MESSAGES)
    container, key = draw(st.sampled_from(_places(message, [])))
    if isinstance(container, dict) and draw(st.booleans()):
        container[draw(KEYS)] = container.pop(key)
    else:
        container[key] = draw(HOSTILE_PARTS)
    return message


HOSTILE_MESSAGES = st.one_of(
    one_part_hostile(),
    link_messages(  # any part hostile
        text=HOSTILE_TEXT, metric_keys=KEYS, data_keys=KEYS,
        number=NUMBERS, wall_time=st.one_of(WALL_TIME, NUMBERS),
        count=st.one_of(COUNT, NUMBERS), seq=st.one_of(COUNT, NUMBERS),
        kinds=st.sampled_from([*EVENT_KINDS, "lunch"]), depth=st.integers(1, 90),
    ),
    st.dictionaries(KEYS, st.one_of(NUMBERS, HOSTILE_TEXT), max_size=4),  # anything at all
)  # fmt: skip


@pytest.fixture
def link_run():
    return submitted_run("hostile-link")


def store_and_show(user, run, accepted: list[dict]) -> None:
    """Store accepted messages as the link does (metrics alone are one statement on
    PostgreSQL, others a transaction) and read every page that shows them: no storage
    error, no 500."""
    points = [message for message in accepted if message["type"] == "metrics"]
    if points:
        telemetry.record_many(run.pk, points)
    telemetry.record_many(run.pk, accepted)
    client = APIClient()
    client.force_login(user)  # pages and the API alike
    for url in (
        f"/api/v1/runs/{run.pk}/success", f"/api/v1/runs/{run.pk}/latest",
        f"/api/v1/runs/{run.pk}/events", f"/runs/{run.pk}/", "/console/audit/",
    ):  # fmt: skip
        response = client.get(url)
        assert response.status_code == 200, (url, response.content[:500])


def link_examples(how_many: int):
    # Each example stores and reads five pages: a modest number keeps the suite fast.
    return hypothesis_settings(
        max_examples=how_many, deadline=None, suppress_health_check=list(HealthCheck)
    )


@pytest.mark.django_db(transaction=True)  # the link's own way: its one-statement path too
@link_examples(50)
@given(messages=st.lists(TRAINER_MESSAGES, min_size=1, max_size=3))
def test_the_link_accepts_what_a_trainer_may_send_and_stores_and_shows_it(
    admin, link_run, messages
):
    accepted = [telemetry.parse_message(json.dumps(message)) for message in messages]
    store_and_show(admin, link_run, accepted)


@pytest.mark.django_db(transaction=True)
@link_examples(100)
@given(messages=st.lists(st.one_of(HOSTILE_MESSAGES, TRAINER_MESSAGES), min_size=1, max_size=3))
def test_the_link_refuses_hostile_messages_by_name_and_stores_what_it_accepts(
    admin, link_run, messages
):
    accepted = []
    for message in messages:
        try:
            accepted.append(telemetry.parse_message(json.dumps(message)))
        except telemetry.InvalidMessage as refused:
            assert refused.error  # names what is wrong
    event(f"{len(accepted)} of {len(messages)} accepted")
    if accepted:
        store_and_show(admin, link_run, accepted)
