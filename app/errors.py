"""Domain errors and the OpenAI-style error JSON they become (:mod:`app.handlers` maps them).

Every error leaving the service has the shape ``{"error": {"message", "type", "param", "code"}}``.
Client mistakes are 4xx naming the offending field in ``param``; a backend that does not answer is
502/503; a passed deadline is 504; anything unexpected is a 500 without a traceback.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class HasErrors(Protocol):
    """A pydantic ``ValidationError`` or FastAPI's ``RequestValidationError``."""

    def errors(self) -> Sequence[Any]: ...


class TTCError(Exception):
    """Base of every error the service reports to a client."""

    status_code = 500
    type = "internal_error"
    code: str | None = None

    def __init__(
        self, message: str, *, param: str | None = None, code: str | None = None,
        headers: dict[str, str] | None = None, extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers = headers
        self.extra = extra

    def body(self) -> dict[str, Any]:
        err: dict[str, Any] = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        out: dict[str, Any] = {"error": err}
        if self.extra:
            out.update(self.extra)
        return out


class InvalidRequest(TTCError):
    status_code = 400
    type = "invalid_request_error"


class Unauthorized(TTCError):
    status_code = 401
    type = "authentication_error"
    code = "invalid_api_key"


class Forbidden(TTCError):
    status_code = 403
    type = "permission_error"


class MisdirectedRequest(TTCError):
    status_code = 421
    type = "invalid_request_error"


class UnsupportedMediaType(TTCError):
    status_code = 415
    type = "invalid_request_error"
    code = "unsupported_media_type"


class NotFound(TTCError):
    status_code = 404
    type = "not_found_error"


class Conflict(TTCError):
    status_code = 409
    type = "conflict_error"


class RateLimited(TTCError):
    status_code = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"


class BackendError(TTCError):
    """A backend answered, but with an error we cannot pass on as a client mistake."""

    status_code = 502
    type = "backend_error"
    code = "bad_gateway"


class BackendUnavailable(TTCError):
    """No backend could serve the call (all down, cooling off, or retries exhausted)."""

    status_code = 503
    type = "service_unavailable"
    code = "no_backend_available"


class ClientClosed(TTCError):
    """The client went away before the answer (nginx's 499; nobody reads the body)."""

    status_code = 499
    type = "cancelled"
    code = "client_closed_request"


class DeadlineExceeded(TTCError):
    status_code = 504
    type = "timeout_error"
    code = "deadline_exceeded"


_UNION_MEMBERS = frozenset({"str", "int", "float", "bool", "none", "list", "dict"})
"""Scalar members of a union, as pydantic names them in an error's location."""


def _loc_to_param(loc: tuple[Any, ...] | list[Any]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path")]
    # pydantic reports union members / tagged variants as extra loc entries; drop type names.
    parts = [p for p in parts if not p.startswith(("function-", "union[", "tagged-union["))
             and p not in _UNION_MEMBERS and not (p[:1].isupper() and p.isidentifier())]
    out = ""
    for p in parts:
        out += f"[{p}]" if p.isdigit() else (f".{p}" if out else p)
    return out


def validation_to_error(exc: HasErrors, prefix: str = "") -> InvalidRequest:
    """Turn the first pydantic error into a 400 that names the field (``prefix`` is prepended)."""
    errors = exc.errors()
    # a value that fits no member of a union fails once per member: the deepest failure is the one
    # that names what is wrong (an inline policy's bad field, not "policy is not a string")
    first = max(errors, key=lambda e: len(e.get("loc", ()))) if errors else {"loc": (), "msg": "invalid request"}
    param = _loc_to_param(tuple(first.get("loc", ())))
    if prefix:
        param = f"{prefix}.{param}" if param else prefix
    msg = str(first.get("msg", "invalid value"))
    more = f" (and {len(errors) - 1} more error(s))" if len(errors) > 1 else ""
    if first.get("type") == "extra_forbidden":
        return InvalidRequest(f"Unknown field '{param}': this service does not support it{more}.",
                              param=param or None, code="unknown_field")
    text = f"Invalid value for '{param}': {msg}{more}" if param else f"Invalid request body: {msg}{more}"
    return InvalidRequest(text, param=param or None, code="invalid_value")
