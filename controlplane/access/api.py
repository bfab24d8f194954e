"""The access table at the doors of the REST API (DRF)."""

from typing import TYPE_CHECKING

from rest_framework.exceptions import MethodNotAllowed
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from controlplane.access.doors import Answer, verdict
from controlplane.access.pages import door_of

if TYPE_CHECKING:  # DRF imports this module while rest_framework.views is being loaded
    from rest_framework.views import APIView


class DoorPermission(BasePermission):
    """The table's rule for the route's URL name and the method. DRF turns a refusal into
    401 when no credentials came (with the Bearer challenge) and 403 otherwise."""

    message = "Your role does not allow this."

    def has_permission(self, request: Request, view: "APIView") -> bool:
        decision = verdict(request.user, door_of(request), request.method)
        if decision.answer is Answer.NO_SUCH_METHOD:
            # Also when the view has a handler the table does not list: closed by default.
            raise MethodNotAllowed(request.method)
        if not decision.allowed:
            self.message = decision.reason
        return decision.allowed
