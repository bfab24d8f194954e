"""Per-user API tokens: stored hashed, Bearer authentication, revocation, roles."""

import hashlib
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.api import tokens
from controlplane.api.models import ApiToken

pytestmark = pytest.mark.django_db

TWO_NODES = "cluster:\n  num_nodes: 1\n  node_groups:\n    - label: box\n      node_ranks: 0\n"


def user_with_role(username: str, role: str | None = None):
    user = get_user_model().objects.create_user(username)
    if role:
        user.groups.add(Group.objects.get_or_create(name=role)[0])
    return user


def bearer(plain: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plain}")
    return client


def test_it_stores_only_a_hash_of_the_secret():
    token, plain = tokens.create_token(user_with_role("ada"), "CI")
    kind, prefix, secret = plain.split("_")
    assert (kind, prefix) == ("arm", token.prefix)
    assert len(secret) == tokens.SECRET_LENGTH
    assert token.secret_hash == hashlib.sha256(secret.encode()).hexdigest()
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {ApiToken._meta.db_table}")
        stored = " ".join(str(value) for row in cursor.fetchall() for value in row)
    assert token.secret_hash in stored
    assert secret not in stored
    assert plain not in stored


def test_it_authenticates_a_bearer_token_with_its_users_role():
    _, plain = tokens.create_token(user_with_role("ada", "admin"), "CI")
    api = bearer(plain)
    assert api.get("/api/v1/clusters").status_code == 200
    created = api.post("/api/v1/clusters", {"name": "lab", "yaml": TWO_NODES}, format="json")
    assert created.status_code == 201


def test_a_token_needs_no_csrf_token():
    _, plain = tokens.create_token(user_with_role("ada", "admin"), "CI")
    api = APIClient(enforce_csrf_checks=True)
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {plain}")
    created = api.post("/api/v1/clusters", {"name": "lab", "yaml": TWO_NODES}, format="json")
    assert created.status_code == 201


def test_a_viewers_token_gets_403_on_an_admin_endpoint():
    _, plain = tokens.create_token(user_with_role("vic", "viewer"), "CI")
    refused = bearer(plain).post(
        "/api/v1/clusters", {"name": "lab", "yaml": TWO_NODES}, format="json"
    )
    assert refused.status_code == 403
    assert refused.json()["detail"] == "This needs the admin role; you are viewer."


def test_no_credentials_get_401_with_a_bearer_challenge():
    response = APIClient().get("/api/v1/clusters")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"


def test_a_revoked_token_gets_401_saying_so():
    token, plain = tokens.create_token(user_with_role("ada", "admin"), "old CI")
    tokens.revoke_token(token)
    response = bearer(plain).get("/api/v1/clusters")
    assert response.status_code == 401
    assert response.json()["detail"] == (
        f"API token 'old CI' (arm_{token.prefix}) has been revoked."
    )


def test_a_token_works_until_it_expires():
    user = user_with_role("ada", "admin")
    soon = timezone.now() + timedelta(minutes=5)
    token, plain = tokens.create_token(user, "short CI", expires_at=soon)
    assert ApiToken.objects.get(pk=token.pk).expires_at == soon
    assert bearer(plain).get("/api/v1/clusters").status_code == 200
    ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    response = bearer(plain).get("/api/v1/clusters")
    assert response.status_code == 401
    assert response.json()["detail"].startswith(
        f"API token 'short CI' (arm_{token.prefix}) expired on "
    )


def test_a_token_without_an_expiry_never_expires():
    token, plain = tokens.create_token(user_with_role("ada"), "CI")
    assert token.expires_at is None and not token.is_expired
    assert bearer(plain).get("/api/v1/clusters").status_code == 200


@pytest.mark.parametrize(
    ("header", "detail"),
    [
        ("Bearer arm_nosuchpx_secret", "Unknown API token."),
        ("Bearer something-else", "Malformed API token: expected arm_<prefix>_<secret>."),
        ("Bearer", "Invalid Authorization header: expected 'Bearer arm_<prefix>_<secret>'."),
        ("Bearer a b", "Invalid Authorization header: expected 'Bearer arm_<prefix>_<secret>'."),
    ],
)
def test_bad_tokens_get_401_with_a_clear_message(header: str, detail: str):
    response = APIClient().get("/api/v1/clusters", HTTP_AUTHORIZATION=header)
    assert response.status_code == 401
    assert response.json()["detail"] == detail


def test_a_right_prefix_with_a_wrong_secret_is_unknown():
    token, plain = tokens.create_token(user_with_role("ada"), "CI")
    response = bearer(plain[:-1] + ("x" if plain[-1] != "x" else "y")).get("/api/v1/clusters")
    assert response.status_code == 401
    assert response.json()["detail"] == "Unknown API token."


def test_an_inactive_users_token_gets_401():
    user = user_with_role("gone", "admin")
    _, plain = tokens.create_token(user, "CI")
    user.is_active = False
    user.save()
    assert bearer(plain).get("/api/v1/clusters").status_code == 401


def test_it_records_last_use_at_most_once_a_minute():
    token, plain = tokens.create_token(user_with_role("ada"), "CI")
    assert token.last_used_at is None
    tokens.authenticate_token(plain)
    first = ApiToken.objects.get(pk=token.pk).last_used_at
    assert first is not None
    tokens.authenticate_token(plain)
    assert ApiToken.objects.get(pk=token.pk).last_used_at == first
    an_hour_ago = timezone.now() - timedelta(hours=1)
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=an_hour_ago)
    tokens.authenticate_token(plain)
    assert ApiToken.objects.get(pk=token.pk).last_used_at > an_hour_ago


def test_revoking_twice_keeps_the_first_time():
    token, _ = tokens.create_token(user_with_role("ada"), "CI")
    first = tokens.revoke_token(token).revoked_at
    assert tokens.revoke_token(ApiToken.objects.get(pk=token.pk)).revoked_at == first


def test_the_schema_describes_the_bearer_scheme():
    _, plain = tokens.create_token(user_with_role("ada"), "CI")
    schema = bearer(plain).get("/api/v1/schema/", HTTP_ACCEPT="application/json").json()
    assert schema["components"]["securitySchemes"]["apiToken"] == {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "arm_<prefix>_<secret>",
    }


def test_admins_revoke_tokens_in_the_admin_but_cannot_add_them():
    owner = user_with_role("ada")
    token, plain = tokens.create_token(owner, "CI")
    boss = get_user_model().objects.create_superuser("boss", password="pw-boss-123")
    site = APIClient()
    site.force_login(boss)
    assert site.get("/admin/api/apitoken/").status_code == 200
    assert site.get("/admin/api/apitoken/add/").status_code == 403
    page = site.get(f"/admin/api/apitoken/{token.pk}/change/").content.decode()
    assert plain.split("_")[2] not in page
    site.post("/admin/api/apitoken/", {"action": "revoke", "_selected_action": [token.pk]})
    assert ApiToken.objects.get(pk=token.pk).revoked_at is not None
