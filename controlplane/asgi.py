"""ASGI entry point: HTTP through Django, WebSockets through Channels."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter  # noqa: E402  (needs Django set up)

from controlplane.realtime.publish import mark_web_process  # noqa: E402
from controlplane.realtime.routing import websocket_application  # noqa: E402

mark_web_process()

application = ProtocolTypeRouter({"http": django_asgi_app, "websocket": websocket_application})
