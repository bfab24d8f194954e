"""Roles: viewer < operator < admin. A user's role is the highest of the Django groups
named after a role that they belong to; superusers are admins; everyone else a viewer."""

from rest_framework.permissions import SAFE_METHODS, BasePermission

ROLES = ("viewer", "operator", "admin")


def role_of(user) -> str | None:
    if not user or not user.is_authenticated:
        return None
    if user.is_superuser:
        return "admin"
    names = set(user.groups.values_list("name", flat=True))
    return next((role for role in reversed(ROLES) if role in names), "viewer")


def has_role(user, needed: str) -> bool:
    role = role_of(user)
    return role is not None and ROLES.index(role) >= ROLES.index(needed)


class RolePermission(BasePermission):
    """Reading needs `viewer`; writing needs the view's `write_role` (operator unless
    the view says otherwise)."""

    message = "Your role does not allow this."

    def has_permission(self, request, view) -> bool:
        needed = (
            "viewer" if request.method in SAFE_METHODS else getattr(view, "write_role", "operator")
        )
        if has_role(request.user, needed):
            return True
        role = role_of(request.user)
        if role is not None:
            self.message = f"This needs the {needed} role; you are {role}."
        return False
