"""A logged-in browser session against a live control plane, with the standard library:
the login form, then the JSON API with the session cookie and the CSRF token."""

import http.cookiejar
import json
import re
import urllib.request


class WebSession:
    def __init__(self, url: str):
        self.url = url
        self.cookies = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.cookies))

    def login(self, username: str, password: str) -> None:
        page = self.opener.open(f"{self.url}/login/", timeout=30).read().decode()
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
        form = urllib.parse.urlencode(
            {"username": username, "password": password, "csrfmiddlewaretoken": token}
        ).encode()
        with self.opener.open(f"{self.url}/login/", form, timeout=30) as reply:
            if reply.url.rstrip("/").endswith("/login"):
                raise PermissionError(f"could not log in as {username}")

    def api(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        csrf = next((c.value for c in self.cookies if c.name == "csrftoken"), "")
        request = urllib.request.Request(
            f"{self.url}/api/v1/{path}",
            data=json.dumps(body).encode() if body is not None else None,
            method=method,
            headers={"Content-Type": "application/json", "X-CSRFToken": csrf},
        )
        try:
            with self.opener.open(request, timeout=30) as reply:
                return reply.status, json.load(reply)
        except urllib.error.HTTPError as error:
            return error.code, json.load(error)
