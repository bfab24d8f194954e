"""`Authorization: Bearer arm_…` for the REST API, with per-user API tokens."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.request import Request

from controlplane.api.models import ApiToken
from controlplane.api.tokens import InvalidToken, authenticate_token


class BearerTokenAuthentication(BaseAuthentication):
    keyword = b"bearer"

    def authenticate(self, request: Request) -> tuple[object, ApiToken] | None:
        words = get_authorization_header(request).split()
        if not words or words[0].lower() != self.keyword:
            return None  # not ours: let session authentication try
        if len(words) != 2:
            raise exceptions.AuthenticationFailed(
                "Invalid Authorization header: expected 'Bearer arm_<prefix>_<secret>'."
            )
        try:
            token = authenticate_token(words[1].decode("ascii"))
        except UnicodeDecodeError as error:
            raise exceptions.AuthenticationFailed("Malformed API token.") from error
        except InvalidToken as error:
            raise exceptions.AuthenticationFailed(str(error)) from error
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        # Having a WWW-Authenticate value makes DRF answer 401 (not 403) without credentials.
        return "Bearer"


class BearerTokenScheme(OpenApiAuthenticationExtension):
    """Describes the token scheme in the OpenAPI schema."""

    target_class = "controlplane.api.authentication.BearerTokenAuthentication"
    name = "apiToken"

    def get_security_definition(self, auto_schema: object) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "bearerFormat": "arm_<prefix>_<secret>"}
