import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from rest_framework.test import APIClient


@pytest.fixture
def operator() -> APIClient:
    """The API as an operator, olga."""
    user = get_user_model().objects.create_user("olga")
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    client = APIClient()
    client.force_authenticate(user)
    return client
