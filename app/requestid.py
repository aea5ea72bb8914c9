"""Request ids: an ASGI middleware that gives every HTTP request an id and returns it.

The id is the client's ``x-request-id`` header when it is 1-128 characters of ``[A-Za-z0-9._:-]``,
else a new ``req-<24 hex>``. It is kept in ``scope["state"]["request_id"]`` (what
:func:`request_id_of` reads), and every response carries it as ``x-request-id``. Pure ASGI, so it
costs one header scan and one header append per request.
"""

from __future__ import annotations

import os
import re
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

_VALID = re.compile(rb"[A-Za-z0-9._:\-]{1,128}")
HEADER = b"x-request-id"


def new_request_id() -> str:
    return f"req-{os.urandom(12).hex()}"


def request_id_of(scope: Scope | dict[str, Any]) -> str:
    """The id the middleware gave this request (a new one outside the middleware)."""
    state = scope.get("state") or {}
    rid = state.get("request_id")
    return rid if isinstance(rid, str) else new_request_id()


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = None
        for name, value in scope.get("headers", ()):
            if name == HEADER:
                rid = value.decode("latin-1") if _VALID.fullmatch(value) else None
                break
        rid = rid or new_request_id()
        scope.setdefault("state", {})["request_id"] = rid
        raw = rid.encode("latin-1")

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (HEADER, raw)]
            await send(message)

        await self.app(scope, receive, send_with_id)
