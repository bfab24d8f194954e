from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "controlplane.core"
    label = "core"

    def ready(self) -> None:
        # The Celery app must exist before any task is sent, in every process.
        import controlplane.celery  # noqa: F401
        from controlplane.core import worker_events  # noqa: F401  (connects signals)
