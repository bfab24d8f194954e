from channels.auth import AuthMiddlewareStack
from channels.routing import URLRouter
from channels.security.websocket import AllowedHostsOriginValidator
from django.urls import URLPattern, path, re_path

from controlplane.access.sockets import GuardedConsumer
from controlplane.console.consumers import ConsoleConsumer
from controlplane.realtime.consumers import StatusConsumer
from controlplane.realtime.run_consumers import RunUpdatesConsumer
from controlplane.realtime.trainer_consumer import TrainerConsumer
from controlplane.sweeps.consumers import SweepConsumer


def door(route: str, consumer: type[GuardedConsumer], name: str) -> URLPattern:
    """A route whose name is its door in the access table (controlplane/access/doors.py)."""
    return path(route, consumer.as_asgi(door=name), name=name)


# Browsers' sockets.
websocket_urlpatterns = [
    door("ws/status/", StatusConsumer, "ws-status"),
    door("ws/runs/", RunUpdatesConsumer, "ws-runs"),
    door("ws/runs/<int:run_id>/", RunUpdatesConsumer, "ws-run"),
    door("ws/console/<int:run_id>/", ConsoleConsumer, "ws-console"),
    door("ws/sweeps/<int:sweep_id>/", SweepConsumer, "ws-sweep"),
]

# Trainers' links: authenticated by their run's token, and sent without an Origin header,
# which the origin check refuses; so they skip it (and the session middleware).
trainer_urlpatterns = [
    door("ws/trainer/<int:run_id>/", TrainerConsumer, "ws-trainer"),
]

# Browsers authenticate with their session cookie; other origins are refused.
browser_application = AllowedHostsOriginValidator(
    AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
)

websocket_application = URLRouter(
    [
        *trainer_urlpatterns,
        re_path(r"^", browser_application),  # every other path: the browsers' branch
    ]
)
