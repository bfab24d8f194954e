"""Armature's control plane: a Django project (web, API, realtime, Celery tasks)."""

from controlplane.celery import app as celery_app

__all__ = ("celery_app",)
