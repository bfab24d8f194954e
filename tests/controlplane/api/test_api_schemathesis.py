"""Schemathesis against the live OpenAPI schema at /api/v1/schema/: a few generated
requests per operation, valid and invalid ones, as an admin token; no operation may
answer 5xx.

Driven through Hypothesis directly: schemathesis' lazy pytest loader (`from_fixture`,
needed because the token lives in the test database) does not work with pytest 9.
"""

import pytest
import schemathesis
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode

from controlplane.api.tokens import create_token

pytestmark = pytest.mark.django_db

# Bounded and reproducible: few examples per operation and mode, derandomized (a fixed
# seed), no shrinking (the first failing request is reported as it was).
BOUNDED = settings(
    max_examples=5,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture
def api_token() -> str:
    admin = get_user_model().objects.create_user("schema-admin")
    admin.groups.add(Group.objects.get_or_create(name="admin")[0])
    return create_token(admin, "schemathesis")[1]


@pytest.fixture
def wsgi_app():
    # As Django's own test client does: a request must not close the test's database
    # connection, whose open transaction holds the test's data.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield get_wsgi_application()
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


def server_errors(
    operation, mode: GenerationMode, headers: dict[str, str], calls: list[str]
) -> list[str]:
    """The first request of `mode` that `operation` answered with 5xx, if any."""

    @BOUNDED
    @given(case=operation.as_strategy(generation_mode=mode))
    def no_server_error(case: schemathesis.Case) -> None:
        response = case.call(headers=headers)
        calls.append(f"{case.method} {case.path} {response.status_code}")
        assert response.status_code < 500, (
            f"{case.method} {case.formatted_path} ({mode.value}) → {response.status_code}\n"
            f"{case.as_curl_command()}\n{response.text[:1500]}"
        )

    try:
        no_server_error()
    except AssertionError as error:
        return [str(error)]
    return []


def test_no_operation_answers_a_server_error(api_token: str, wsgi_app):
    headers = {"Authorization": f"Bearer {api_token}"}
    schema = schemathesis.openapi.from_wsgi(
        "/api/v1/schema/?format=json", wsgi_app, headers=headers
    )
    operations = [result.ok() for result in schema.get_all_operations()]
    calls: list[str] = []
    problems = [
        problem
        for operation in operations
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
        for problem in server_errors(operation, mode, headers, calls)
    ]
    assert not problems, "\n\n".join(problems)
    # Every operation was really called (a skipped operation would pass silently).
    called = {call.rsplit(" ", 1)[0] for call in calls}
    assert {f"{op.method.upper()} {op.path}" for op in operations} <= called
