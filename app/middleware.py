"""The service's one ASGI middleware, outside every route: a request id, what a web page the operator
happens to open cannot make the service do, and the body size limit. One header scan per request.

**Request id.** The client's ``x-request-id`` header when it is 1-128 characters of
``[A-Za-z0-9._:-]``, else a new ``req-<24 hex>``. It is kept in ``scope["state"]["request_id"]`` (what
:func:`request_id_of` reads), and every response carries it as ``x-request-id``, the refusals below
included.

**Cross-site writes and DNS rebinding.** The service listens on loopback with auth off by default, and
the operator's browser can reach loopback. A page on any site may send it requests: a "simple"
cross-origin POST (a form, or ``fetch`` with ``text/plain``) needs no CORS preflight, and a page whose
own host name the attacker re-points at 127.0.0.1 (DNS rebinding) is same-origin to the browser and
may read the answers. Three checks, on every request:

* **Host**: the ``Host`` header must be an IP literal (rebinding needs a name), ``localhost``, or one of
  ``server.allowed_hosts`` (the names the service is reached by; ``*`` turns the check off); else
  ``421`` ``host_not_allowed``.
* **Origin**: a state-changing request (``POST``, ``PUT``, ``PATCH``, ``DELETE``) a browser sends
  carries ``Origin``; it must be the service's own origin (the same host and port as ``Host``) or one of
  ``server.allowed_origins``; else ``403`` ``cross_origin``. Clients that are not browsers send none.
* **Content type**: a state-changing request with a body must say ``application/json`` (the only type
  a cross-origin page cannot send without a preflight the service never grants); else ``415``
  ``unsupported_media_type``.

**Body size.** A body above ``max_bytes`` is a 413 ``body_too_large``: at once when its
``content-length`` says so; a body without a valid one (chunked) is counted as it is received, and the
route's body read raises as soon as it passes the limit (the app's error handler answers). A body
with a valid ``content-length`` within the limit is not wrapped: the HTTP server holds a body to its
declared length.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import Forbidden, MisdirectedRequest, TTCError, UnsupportedMediaType

WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_VALID_ID = re.compile(rb"[A-Za-z0-9._:\-]{1,128}")
REQUEST_ID = b"x-request-id"


def new_request_id() -> str:
    return f"req-{os.urandom(12).hex()}"


def request_id_of(scope: Scope | dict[str, Any]) -> str:
    """The id the middleware gave this request (a new one outside the middleware)."""
    state = scope.get("state") or {}
    rid = state.get("request_id")
    return rid if isinstance(rid, str) else new_request_id()


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


class BodyTooLarge(TTCError):
    status_code = 413
    type = "invalid_request_error"
    code = "body_too_large"


class EdgeMiddleware:
    """The request id, the three checks and the body limit of the module doc (pure ASGI)."""

    def __init__(self, app: ASGIApp, *, max_bytes: int, allowed_hosts: Iterable[str] = (),
                 allowed_origins: Iterable[str] = ()) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.hosts = {h.lower() for h in allowed_hosts} | {"localhost"}
        self.any_host = "*" in self.hosts
        self.origins = {o.lower().rstrip("/") for o in allowed_origins}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", ()))
        given = headers.get(REQUEST_ID)
        rid = given.decode("latin-1") if given is not None and _VALID_ID.fullmatch(given) else new_request_id()
        scope.setdefault("state", {})["request_id"] = rid
        raw = rid.encode("latin-1")

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (REQUEST_ID, raw)]
            await send(message)

        length = headers.get(b"content-length")
        error = self.refusal(scope, headers)
        if error is None and length is not None and length.isdigit() and int(length) > self.max_bytes:
            error = self.too_large()
        if error is not None:
            await send_error(send_with_id, error)
            return
        if length is None or not length.isdigit():
            receive = self.counted(receive)
        await self.app(scope, receive, send_with_id)

    def refusal(self, scope: Scope, headers: dict[bytes, bytes]) -> TTCError | None:
        """The first of the three checks this request fails (``None``: it passes them)."""
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

    def counted(self, receive: Receive) -> Receive:
        """``receive``, raising :class:`BodyTooLarge` once the body received passes the limit."""
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise self.too_large()
            return message

        return limited

    def too_large(self) -> BodyTooLarge:
        return BodyTooLarge(f"The request body is larger than this server's limit of {self.max_bytes} bytes.")


async def send_error(send: Send, err: TTCError) -> None:
    body = orjson.dumps(err.body())
    await send({"type": "http.response.start", "status": err.status_code,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
