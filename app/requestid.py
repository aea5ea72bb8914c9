"""The service's two ASGI middlewares: request ids, and the request body size limit.

Request ids:
The id is the client's ``x-request-id`` header when it is 1-128 characters of ``[A-Za-z0-9._:-]``,
else a new ``req-<24 hex>``. It is kept in ``scope["state"]["request_id"]`` (what
:func:`request_id_of` reads), and every response carries it as ``x-request-id``. Pure ASGI, so it
costs one header scan and one header append per request.
"""

from __future__ import annotations

import os
import re
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import TTCError

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


class BodyTooLarge(TTCError):
    status_code = 413
    type = "invalid_request_error"
    code = "body_too_large"


class BodyLimitMiddleware:
    """Bodies above ``max_bytes`` are refused with a 413 in the error envelope: at once when the
    ``content-length`` says so, else as soon as the bytes received pass the limit (the route's body
    read raises, and the app's error handler answers)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await send_error(send, self._error())
                return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise self._error()
            return message

        await self.app(scope, limited, send)

    def _error(self) -> BodyTooLarge:
        return BodyTooLarge(f"The request body is larger than this server's limit of {self.max_bytes} bytes.")


async def send_error(send: Send, err: TTCError) -> None:
    body = orjson.dumps(err.body())
    await send({"type": "http.response.start", "status": err.status_code,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
