from channels.auth import AuthMiddlewareStack
from channels.routing import URLRouter
from channels.security.websocket import AllowedHostsOriginValidator
from django.urls import path, re_path

from controlplane.realtime.consumers import StatusConsumer
from controlplane.realtime.run_consumers import RunUpdatesConsumer
from controlplane.realtime.trainer_consumer import TrainerConsumer

# Browsers' sockets.
websocket_urlpatterns = [
    path("ws/status/", StatusConsumer.as_asgi()),
    path("ws/runs/", RunUpdatesConsumer.as_asgi()),
    path("ws/runs/<int:run_id>/", RunUpdatesConsumer.as_asgi()),
]

# Trainers' links: authenticated by their run's token, and sent without an Origin header,
# which the origin check refuses; so they skip it (and the session middleware).
trainer_urlpatterns = [
    path("ws/trainer/<int:run_id>/", TrainerConsumer.as_asgi()),
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
