from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "controlplane.console"
    label = "console"

    def ready(self) -> None:
        # Operators' sockets re-check a role whose version changed: the receivers that
        # change versions must run in every process that can change a role.
        from controlplane.access import role_versions  # noqa: F401  (connects signals)
