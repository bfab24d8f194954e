"""The relay endpoint through which other processes publish in the one-machine mode."""

from django.core import signing
from django.http import Http404, HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from controlplane.access.pages import guarded
from controlplane.realtime.publish import (
    ReplayedMessage,
    publish_async,
    relay_is_served,
    unsign_relay_payload,
)


@csrf_exempt  # authenticated by the signature over the body instead
@guarded
async def relay(request: HttpRequest) -> JsonResponse:
    if not relay_is_served():  # not mounted then (controlplane/urls.py); never served
        raise Http404("the relay exists only with the in-memory channel layer")
    try:
        group, message = unsign_relay_payload(request.body)
    except signing.BadSignature:
        return JsonResponse({"error": "bad or expired signature"}, status=403)
    except ReplayedMessage:
        return JsonResponse({"error": "message already delivered: each is accepted once"},
                            status=403)  # fmt: skip
    except (KeyError, TypeError, ValueError, UnicodeDecodeError):
        return JsonResponse(
            {"error": "body must be a signed {group, message, nonce} object"}, status=400
        )
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        return JsonResponse({"error": "message must be an object with a string 'type'"}, status=400)
    try:
        await publish_async(group, message)
    except TypeError as exc:  # channels rejects invalid group names with TypeError
        return JsonResponse({"error": str(exc)}, status=400)
    return JsonResponse({"ok": True})
