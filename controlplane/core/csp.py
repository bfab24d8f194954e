"""The Content-Security-Policy header of every response (docs/permissions.md, "Other
limits at the doors"): scripts, styles, fonts and images come only from this server;
no inline script, inline event handler, `style` attribute or `<style>` element runs,
and nothing is evaluated from a string. Pages keep their code in static files and the
data their scripts need in `json_script` elements; a style that depends on data is set
through `element.style` (the CSS object model), which the policy allows."""

from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponse
from django.utils.deprecation import MiddlewareMixin

HEADER = "Content-Security-Policy"

# The policy, one directive per key. 'self' matches the page's own ws:/wss: origin in
# CSP 3 browsers; the sockets' URLs are added per request for the older ones.
CONTENT_SECURITY_POLICY: dict[str, str] = {
    "default-src": "'self'",
    "script-src": "'self'",
    "style-src": "'self'",
    "img-src": "'self' data:",  # the console's camera frames and Swagger UI's icons
    "font-src": "'self'",
    "connect-src": "'self'",
    "object-src": "'none'",
    "base-uri": "'none'",
    "form-action": "'self'",
    "frame-ancestors": "'none'",
}


def content_security_policy(request: HttpRequest) -> str:
    """The header's value for `request`: the policy, with the sockets of the host the
    request was addressed to (a host Django refuses adds nothing)."""
    directives = dict(CONTENT_SECURITY_POLICY)
    try:
        host = request.get_host()
    except DisallowedHost:
        host = ""
    if host:
        directives["connect-src"] += f" ws://{host} wss://{host}"
    return "; ".join(f"{name} {value}" for name, value in directives.items())


class ContentSecurityPolicyMiddleware(MiddlewareMixin):
    """Sets the policy on every response that does not carry one of its own."""

    def process_response(self, request: HttpRequest, response: HttpResponse) -> HttpResponse:
        if HEADER not in response.headers:
            response.headers[HEADER] = content_security_policy(request)
        return response
