"""Roles: viewer < operator < admin. A user's role is the highest of the Django groups
named after a role that they belong to; superusers are admins; any other logged-in user
is a viewer. Anonymous users have no role."""

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

ROLES = ("viewer", "operator", "admin")

# The role is read once per request: views and templates may ask several times.
_CACHED_ROLE = "_armature_role"


def role_of(user: AbstractBaseUser | AnonymousUser | None) -> str | None:
    if user is None or not user.is_authenticated:
        return None
    cached = getattr(user, _CACHED_ROLE, None)
    if cached is not None:
        return cached
    if user.is_superuser:
        role = "admin"
    else:
        names = set(user.groups.values_list("name", flat=True))
        role = next((r for r in reversed(ROLES) if r in names), "viewer")
    setattr(user, _CACHED_ROLE, role)
    return role


def has_role(user: AbstractBaseUser | AnonymousUser | None, needed: str) -> bool:
    role = role_of(user)
    return role is not None and ROLES.index(role) >= ROLES.index(needed)
