"""Logging set-up for ``ttc serve``: text or JSON lines, request lines from ``ttc.request``.

``text``: ``time level logger: message``. ``json``: one object per line with ``time``, ``level``,
``logger``, ``message`` and, for request lines, the request's fields (``request_id``, ``policy``,
``samples``, ``rounds``, ``stop_reason``, tokens, ``latency_ms``, ...) at the top level. httpx's
per-call lines are DEBUG-only (the pool logs each backend call at DEBUG itself).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Literal

import orjson

LogFormat = Literal["text", "json"]


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage(),
        }
        fields = getattr(record, "ttc", None)
        if isinstance(fields, dict):
            out.update(fields)
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


def setup_logging(level: str, fmt: LogFormat = "text") -> None:
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    if root.level > logging.DEBUG:
        logging.getLogger("httpx").setLevel(logging.WARNING)
