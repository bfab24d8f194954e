"""The credentials every request of the control plane to Ray's dashboard carries.

A Ray cluster started with `RAY_AUTH_MODE=token` answers 401 to requests without its
token (`Authorization: Bearer <token>`) on every path but a few health probes. The
control plane reads the token from `RAY_AUTH_TOKEN` and sends it itself, rather than
switching Ray's own process-wide auth mode on in the web and worker processes.
"""

from django.conf import settings


def ray_auth_headers() -> dict[str, str]:
    """The headers for a request to RAY_ADDRESS: the bearer token when one is set."""
    token = settings.RAY_AUTH_TOKEN
    return {"Authorization": f"Bearer {token}"} if token else {}
