"""Request bodies: the one place a body becomes a model (:func:`parse_json`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import from_json

from app.errors import InvalidRequest, validation_to_error

B = TypeVar("B", bound=BaseModel)


def parse_json(raw: bytes, model: type[B], check: Callable[[Any], None] | None = None) -> B:
    """A request body as ``model``. The JSON is read first: bad JSON or bad UTF-8 is a 400
    ``invalid_json``, nesting deeper than the parser's limit says so, and a ``NaN`` or ``Infinity``
    anywhere (free-form members a backend receives as they are included: ``tools``, extra message
    members) is a 400 naming where it is (:func:`non_finite`). Then ``check`` sees the plain value
    (sizes are checked there, before any model is built), then the model validates it (a 400 naming
    the field)."""
    try:
        data = from_json(raw)
    except ValueError as exc:
        if "recursion limit" in str(exc):
            raise InvalidRequest("Request body nests arrays and objects deeper than this service reads (about 200 "
                                 "levels).", code="invalid_json") from None
        raise InvalidRequest("Request body is not valid JSON.", code="invalid_json") from None
    if b"NaN" in raw or b"Infinity" in raw:  # a scan of the bytes first: walking a large body costs
        where = non_finite(data)
        if where is not None:
            raise InvalidRequest(f"{where or 'The body'} is not a finite number: NaN and Infinity are not JSON.",
                                 param=where or None, code="invalid_value")
    if check is not None:
        check(data)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_to_error(exc) from None


def non_finite(value: Any, path: str = "") -> str | None:
    """Where the first ``NaN`` or ``Infinity`` in a parsed JSON value is (``messages[0].x``; ``""``: the
    value itself), ``None`` without any."""
    if isinstance(value, float):
        return None if math.isfinite(value) else path
    if isinstance(value, dict):
        for key, item in value.items():
            found = non_finite(item, f"{path}.{key}" if path else str(key))
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = non_finite(item, f"{path}[{i}]")
            if found is not None:
                return found
    return None
