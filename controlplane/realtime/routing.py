from channels.auth import AuthMiddlewareStack
from channels.routing import URLRouter
from channels.security.websocket import AllowedHostsOriginValidator
from django.urls import path

from controlplane.realtime.consumers import StatusConsumer
from controlplane.realtime.run_consumers import RunUpdatesConsumer

websocket_urlpatterns = [
    path("ws/status/", StatusConsumer.as_asgi()),
    path("ws/runs/", RunUpdatesConsumer.as_asgi()),
    path("ws/runs/<int:run_id>/", RunUpdatesConsumer.as_asgi()),
]

# Browsers authenticate with their session cookie; other origins are refused.
websocket_application = AllowedHostsOriginValidator(
    AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
)
