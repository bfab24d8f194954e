"""Where real hardware is reached, and how its address is written into text.

A config names a SERL robot server by URL (`url`) or by host (`robot_ip` and `port`),
and a camera by URL. The trainer sends requests there, so an address is checked where
the config is validated, and again by the clients that use it
(trainer.hardware.serl_franka, trainer.hardware.url_camera):

- only `http` and `https`, with a host, and a port (when given) from 1 to 65535;
- a robot server's URL is a base the endpoints are joined onto: no query string and no
  fragment (`http://arm:5000/?` would make every endpoint a query);
- a camera's URL may have a query (ROS's web_video_server names its topic there), not a
  fragment;
- no spaces, control characters or backslashes anywhere, and no `@` past the host
  (`%40` writes one), so every URL parser reads the same host from it;
- a `robot_ip` is a host name or an IP address, nothing more.

A URL may carry a user and password (`http://user:pass@camera/`, an IP camera's basic
auth); `redact_url` is how any such URL is written into a message, a log line or an
event. Pure functions of the standard library: the control plane uses them too.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit

SCHEMES = ("http", "https")
# A DNS name: dot-separated labels of letters, digits and inner hyphens (or underscores,
# which lab networks' names have), 253 characters at most.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9])?"
_HOST_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?")
_UNSAFE = re.compile(r"[\x00-\x20\x7f\\]")


def redact_url(url: str) -> str:
    """`url` with the password of its user info replaced by `***`
    (`http://user:***@host/`); any other text as it is. The user info is taken up to the
    last `@` before the query, so a password with an unescaped `/` or `@` is hidden
    whole."""
    scheme, separator, rest = url.partition("://")
    if not separator:
        return url
    before_query = re.split(r"[?#]", rest, maxsplit=1)[0]
    userinfo, at, _ = before_query.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    user = userinfo.partition(":")[0]
    return f"{scheme}://{user}:***@{rest[len(userinfo) + 1 :]}"


# A URL's user info with a password, anywhere in a text (a config's YAML, an override):
# the scheme and user are kept, the password (up to the `@` before the host) is not.
_PASSWORD_IN_TEXT = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@'\"]*):[^\s@'\"]*@")


def redact_urls_in(text: str) -> str:
    """`text` with the password of every URL in it replaced by `***` (`redact_url` for
    texts that hold URLs among other things: a frozen config, a config diff)."""
    return _PASSWORD_IN_TEXT.sub(r"\g<head>:***@", text)


def check_host(host: str) -> str:
    """`host` when it is a host name or an IP address (what `robot_ip` holds)."""
    if not _is_host(host):
        raise ValueError(
            "must be a host name or IP address (no scheme, port, path or brackets; put "
            "the port in `port`, or give the whole address as `url`)"
        )
    return host


def check_robot_url(url: str) -> str:
    """`url` when it is a SERL robot server's base URL (see the module's rules)."""
    _checked(url, "a robot server URL")
    if "?" in url:
        raise ValueError("a robot server URL is a base the endpoints are joined onto: no query")
    if "#" in url:
        raise ValueError("a robot server URL has no fragment")
    return url


def check_camera_url(url: str) -> str:
    """`url` when it is a camera's MJPEG stream or snapshot URL (see the module's rules)."""
    _checked(url, "a camera URL")
    if "#" in url:
        raise ValueError("a camera URL has no fragment")
    return url


def robot_base_url(host: str, port: int) -> str:
    """The URL of the SERL server on `host`'s `port` (an IPv6 address in brackets)."""
    check_host(host)
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


def endpoint_url(base: str, endpoint: str) -> str:
    """`endpoint` joined onto the path of `base` (a checked robot server URL)."""
    parts = urlsplit(base)
    return urlunsplit(parts._replace(path=f"{parts.path.rstrip('/')}/{endpoint}", query=""))


def without_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """`url` without its user info, and the (user, password) it held, if any: what a
    client sends as basic auth, so the URL it requests (and names in its errors) holds
    no password."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    host = parts.netloc.rpartition("@")[2]
    auth = (unquote(parts.username or ""), unquote(parts.password or ""))
    return urlunsplit(parts._replace(netloc=host)), auth


def url_host(url: str) -> str:
    """The host and port of `url`, as a message names them (no user info)."""
    return urlsplit(url).netloc.rpartition("@")[2]


def _checked(url: str, what: str) -> SplitResult:
    if _UNSAFE.search(url):
        raise ValueError(f"{what} has no spaces, control characters or backslash")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        got = f"not {scheme}" if scheme else "it has no scheme"
        raise ValueError(f"{what} must be http or https, {got}")
    if not parts.hostname:
        raise ValueError(f"{what} names no host")
    if not _is_host(parts.hostname):
        raise ValueError(f"{what}'s host is not a host name or IP address")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0 and ":" in parts.netloc.rpartition("@")[2].rpartition("]")[2]:
        raise ValueError(f"{what}'s port must be a number from 1 to 65535")
    if "@" in url.partition("://")[2].removeprefix(parts.netloc):
        raise ValueError(f"{what} has no @ past its host (write %40)")
    return parts


def _is_host(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    return len(host) <= 253 and _HOST_NAME.fullmatch(host) is not None
