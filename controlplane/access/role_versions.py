"""A version of each user's role, so an open socket notices at the cost of one cache read
that what decided its user's role may have changed (docs/permissions.md, "Open sockets").

A user's role (roles.py) is read from the database once per request, and a socket is one
long request. The version is an opaque token in the cache, replaced (after the
transaction commits) whenever anything the role or the login depends on changes: the
user's groups (either side of the relation, clear included), a save of the user
(is_active, is_superuser, the password...), the user's deletion, a logout, a group's
rename or deletion. A socket keeps the version it saw at connect; when the current one
differs, it reads the user and the session from the database again (`logged_in_user`).
A version missing from the cache (evicted, never written) reads as a change, never as
"unchanged".

The store must be seen by every process that can change a role (web servers, the
worker, `manage.py`): the project's cache where it is shared (Redis, with REDIS_URL);
where it is per process (the one-machine mode's default, in-memory), a file cache in
the var folder, which every process of the machine shares.
"""

from __future__ import annotations

import functools
import logging
import secrets
from collections.abc import Iterable
from importlib import import_module
from types import SimpleNamespace

from django.conf import settings
from django.contrib import auth
from django.contrib.auth.models import AbstractBaseUser, Group
from django.contrib.auth.signals import user_logged_out
from django.core.cache import BaseCache, caches
from django.core.cache.backends.dummy import DummyCache
from django.core.cache.backends.filebased import FileBasedCache
from django.core.cache.backends.locmem import LocMemCache
from django.db import transaction
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_delete
from django.dispatch import receiver

from controlplane.access.roles import role_of

log = logging.getLogger(__name__)

# Cache stores that only the process itself sees: a change made elsewhere would be missed.
PROCESS_LOCAL = (LocMemCache, DummyCache)
MACHINE_FOLDER = "role-versions"  # under VAR_DIR, where the cache is per process


def _key(user_id: int) -> str:
    return f"access.role-version.{user_id}"


def store() -> BaseCache:
    default = caches["default"]
    return _machine_store() if isinstance(default, PROCESS_LOCAL) else default


@functools.cache
def _machine_store() -> FileBasedCache:
    # Never culled: a culled version would only cost its sockets a database read, but
    # there is no need for even that below a million users.
    return FileBasedCache(
        str(settings.VAR_DIR / MACHINE_FOLDER), {"OPTIONS": {"MAX_ENTRIES": 1_000_000}}
    )


def current(user_id: int) -> str | None:
    """The user's role version now: one cache read."""
    return store().get(_key(user_id))


def seen_at_connect(user_id: int) -> str | None:
    """The version a socket starts from (written first if the cache has none)."""
    versions = store()
    versions.add(_key(user_id), secrets.token_hex(8), timeout=None)
    return versions.get(_key(user_id))


def bump(user_ids: Iterable[int]) -> None:
    """A new version for each user, once the current transaction commits (a socket that
    re-reads the database on seeing it must find the change there)."""
    ids = sorted(set(user_ids))
    if ids:
        transaction.on_commit(lambda: _write(ids), robust=True)


def _write(user_ids: list[int]) -> None:
    store().set_many({_key(user_id): secrets.token_hex(8) for user_id in user_ids}, None)


def logged_in_user(session_key: str | None) -> AbstractBaseUser | None:
    """Whom the session with this key logs in now, read afresh from the database, as
    Django's own session check does for a request; None when it logs in nobody any more
    (logged out, flushed, expired, user deactivated or deleted, password changed). The
    user's role is read too (`role_of` answers without the database from then on)."""
    if not session_key:
        return None
    session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    user = auth.get_user(SimpleNamespace(session=session))
    if not user.is_authenticated:
        return None
    role_of(user)
    return user


# ----- what decides a role (roles.py) or a login ------------------------------------


@receiver(m2m_changed, sender=auth.get_user_model().groups.through)
def _groups_changed(sender, instance, action, reverse, pk_set, **kwargs) -> None:
    if not reverse:  # user.groups.add/remove/clear/set
        if action in ("post_add", "post_remove", "post_clear"):
            bump([instance.pk])
    elif action in ("post_add", "post_remove"):  # group.user_set.add/remove
        bump(pk_set or ())
    elif action == "pre_clear":  # group.user_set.clear: its members, before they go
        bump(instance.user_set.values_list("pk", flat=True))


@receiver(post_save, sender=settings.AUTH_USER_MODEL)
def _user_saved(sender, instance, update_fields=None, **kwargs) -> None:
    if update_fields is not None and set(update_fields) <= {"last_login"}:
        return  # a login's own save: nothing about the role changed
    bump([instance.pk])


@receiver(post_delete, sender=settings.AUTH_USER_MODEL)
def _user_deleted(sender, instance, **kwargs) -> None:
    bump([instance.pk])


@receiver(user_logged_out)
def _logged_out(sender, request, user, **kwargs) -> None:
    if user is not None:
        bump([user.pk])


@receiver(post_save, sender=Group)
def _group_saved(sender, instance, created, **kwargs) -> None:
    if not created:  # a rename may give or take a role
        bump(instance.user_set.values_list("pk", flat=True))


@receiver(pre_delete, sender=Group)
def _group_deleted(sender, instance, **kwargs) -> None:
    bump(instance.user_set.values_list("pk", flat=True))
