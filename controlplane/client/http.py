"""A small JSON-over-HTTP client of the control plane's REST API (urllib only)."""

import json
import shutil
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

USER_AGENT = "armature-ci-client/1"


class ApiError(Exception):
    """The control plane answered with an error status, or could not be reached
    (`status` 0)."""

    def __init__(self, method: str, path: str, status: int, body: Any):
        self.method, self.path, self.status, self.body = method, path, status, body
        super().__init__(f"{method} {path} → {status or 'unreachable'}: {describe_errors(body)}")


def describe_errors(body: Any) -> str:
    """One readable line per error of a DRF / Armature error body."""
    if isinstance(body, dict):
        if isinstance(body.get("errors"), list):
            return "; ".join(
                f"{e.get('path') or e.get('location') or '(config)'}: {e.get('message')}"
                if isinstance(e, dict)
                else str(e)
                for e in body["errors"]
            )
        if "detail" in body:
            return str(body["detail"])
        return "; ".join(f"{key}: {describe_errors(value)}" for key, value in body.items())
    if isinstance(body, list):
        return "; ".join(describe_errors(item) for item in body)
    return str(body)


class ArmatureApi:
    def __init__(self, base_url: str, token: str, request_timeout: float = 30.0):
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.request_timeout = request_timeout

    def download(self, path: str, destination: Path) -> int:
        """Save the body of a GET of `path` to `destination`; its size in bytes."""
        request = urllib.request.Request(
            f"{self.base_url}/api/v1/{path.lstrip('/')}",
            headers={"Authorization": f"Bearer {self.token}", "User-Agent": USER_AGENT},
        )
        try:
            with (
                urllib.request.urlopen(request, timeout=self.request_timeout) as reply,
                destination.open("wb") as saved,
            ):
                shutil.copyfileobj(reply, saved)
        except urllib.error.HTTPError as error:
            raise ApiError("GET", path, error.code, _decode(error.read())) from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise ApiError("GET", path, 0, f"cannot reach {self.base_url}: {reason}") from None
        return destination.stat().st_size

    def call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        """(status, decoded JSON body) of a 2xx answer; raises ApiError otherwise."""
        request = urllib.request.Request(
            f"{self.base_url}/api/v1/{path.lstrip('/')}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={
                "Authorization": f"Bearer {self.token}",
                "Accept": "application/json",
                "User-Agent": USER_AGENT,
                **({"Content-Type": "application/json"} if body is not None else {}),
                **(headers or {}),
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=self.request_timeout) as reply:
                return reply.status, _decode(reply.read())
        except urllib.error.HTTPError as error:
            raise ApiError(method, path, error.code, _decode(error.read())) from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise ApiError(method, path, 0, f"cannot reach {self.base_url}: {reason}") from None


def _decode(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")[:500]
