"""What a web page the operator happens to open cannot make the service do (cross-site writes, DNS
rebinding).

The threat: the service listens on loopback with auth off by default, and the operator's browser can
reach loopback. A page on any site may send it requests: a "simple" cross-origin POST (a form, or
``fetch`` with ``text/plain``) needs no CORS preflight, and a page whose own host name the attacker
re-points at 127.0.0.1 (DNS rebinding) is same-origin to the browser and may read the answers. Three
checks, on every request, before any route runs:

* **Host**: the ``Host`` header must be an IP literal (rebinding needs a name), ``localhost``, or one of
  ``server.allowed_hosts`` (the names the service is reached by; ``*`` turns the check off); else
  ``421`` ``host_not_allowed``.
* **Origin**: a state-changing request (``POST``, ``PUT``, ``PATCH``, ``DELETE``) a browser sends
  carries ``Origin``; it must be the service's own origin (the same host and port as ``Host``) or one of
  ``server.allowed_origins``; else ``403`` ``cross_origin``. Clients that are not browsers send none.
* **Content type**: a state-changing request with a body must say ``application/json`` (the only type
  a cross-origin page cannot send without a preflight the service never grants); else ``415``
  ``unsupported_media_type``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from app.errors import Forbidden, MisdirectedRequest, TTCError, UnsupportedMediaType
from app.requestid import send_error

WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def split_host(value: str) -> tuple[str, str]:
    """``(host, port)`` of a ``Host`` header value (``[::1]:8000`` -> ``("::1", "8000")``)."""
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        return host, rest.removeprefix(":")
    host, _, port = value.rpartition(":") if value.count(":") == 1 else (value, "", "")
    return host, port


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class GuardMiddleware:
    """The three checks of the module doc (pure ASGI, outside every route)."""

    def __init__(self, app: ASGIApp, *, allowed_hosts: Iterable[str] = (), allowed_origins: Iterable[str] = ()) -> None:
        self.app = app
        self.hosts = {h.lower() for h in allowed_hosts} | {"localhost"}
        self.any_host = "*" in self.hosts
        self.origins = {o.lower().rstrip("/") for o in allowed_origins}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            error = self.refusal(scope)
            if error is not None:
                await send_error(send, error)
                return
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope) -> TTCError | None:
        headers = {k.lower(): v for k, v in scope.get("headers", ())}
        host_header = headers.get(b"host", b"").decode("latin-1").strip()
        host, _ = split_host(host_header.lower())
        if host_header and not self.any_host and not is_ip(host) and host not in self.hosts:
            return MisdirectedRequest(f"This service does not answer to the host name {host[:100]!r} (a page whose "
                                      "name points at it, DNS rebinding?). Reach it by IP address or localhost, or "
                                      "add the name to server.allowed_hosts.", param="Host", code="host_not_allowed")
        if scope.get("method") not in WRITES:
            return None
        origin = headers.get(b"origin")
        if origin is not None:
            seen = origin.decode("latin-1").strip().lower().rstrip("/")
            if seen not in self.origins and urlsplit(seen).netloc != host_header.lower():
                return Forbidden(f"A request from the web page at {seen[:100]!r} may not change anything here "
                                 "(its origin is not this service's). Add it to server.allowed_origins to allow "
                                 "it.", param="Origin", code="cross_origin")
        length = headers.get(b"content-length", b"0")
        if length not in (b"", b"0") or b"transfer-encoding" in headers:
            media = headers.get(b"content-type", b"").split(b";", 1)[0].strip().lower()
            if media != b"application/json":
                return UnsupportedMediaType(f"Send the request body as application/json (got "
                                            f"{media.decode('latin-1')[:80] or 'no content type'!r}).",
                                            param="Content-Type")
        return None
