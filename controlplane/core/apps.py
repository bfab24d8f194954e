from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "controlplane.core"
    label = "core"

    def ready(self) -> None:
        from controlplane.core import worker_events  # noqa: F401  (connects signals)
