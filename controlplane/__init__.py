"""Armature's control plane: a Django project (web, API, realtime, Celery tasks).

Kept free of imports so that `controlplane.client` (the CI client) runs without
Django or Celery installed; the Celery app is loaded by `core.apps.CoreConfig`.
"""
