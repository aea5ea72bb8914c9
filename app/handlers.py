"""The one place exceptions become HTTP responses: every one the one error envelope
(:mod:`app.errors`), never a traceback; unexpected errors are logged here and answer 500."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from app.errors import Conflict, Forbidden, InvalidRequest, NotFound, TTCError, Unauthorized, validation_to_error
from app.protocol import JSONBytes

log = logging.getLogger("ttc.errors")
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}


def error_response(err: TTCError) -> JSONBytes:
    return JSONBytes(err.body(), status_code=err.status_code, headers=err.headers)


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at the request's path (the routers asked as they would be)."""
    routes = request.app.router.routes
    return [m for m in _METHODS
            if any(r.matches({**request.scope, "method": m})[0] == Match.FULL for r in routes)]


def install_error_handlers(app: FastAPI) -> None:
    """Map every exception type to the one error envelope."""

    @app.exception_handler(TTCError)
    async def _ttc(_: Request, exc: TTCError) -> JSONBytes:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONBytes:
        return error_response(validation_to_error(exc))  # query and path parameters (bodies: parse_json)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONBytes:
        kinds = {404: NotFound, 401: Unauthorized, 403: Forbidden, 409: Conflict}
        cls = kinds.get(exc.status_code, InvalidRequest if exc.status_code < 500 else TTCError)
        code = _HTTP_CODES.get(exc.status_code)
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # Starlette names the first matching route's methods only
            headers["Allow"] = ", ".join(allowed_methods(request))
        err = cls(str(exc.detail), code=code, headers=headers)
        err.status_code = exc.status_code
        return error_response(err)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONBytes:
        log.exception("unhandled error: %s", exc)
        return error_response(TTCError("Internal server error.", code="internal_error"))
