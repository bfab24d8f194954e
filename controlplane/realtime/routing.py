from channels.auth import AuthMiddlewareStack
from channels.routing import URLRouter
from channels.security.websocket import AllowedHostsOriginValidator
from django.urls import path

from controlplane.realtime.consumers import StatusConsumer

websocket_urlpatterns = [
    path("ws/status/", StatusConsumer.as_asgi()),
]

# Browsers authenticate with their session cookie; other origins are refused.
websocket_application = AllowedHostsOriginValidator(
    AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
)
