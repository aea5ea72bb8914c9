"""``--log-format json``: one JSON object per line, request fields at the top level."""

from __future__ import annotations

import json
import logging

from app.logs import JsonFormatter


def test_json_lines_carry_the_request_fields() -> None:
    record = logging.LogRecord("ttc.request", logging.INFO, __file__, 1, "request_id=r1 samples=4", None, None)
    record.ttc = {"request_id": "r1", "policy": "default", "samples": 4, "latency_ms": 12.5}
    out = json.loads(JsonFormatter().format(record))
    assert out["logger"] == "ttc.request" and out["level"] == "info" and out["message"] == "request_id=r1 samples=4"
    assert out["request_id"] == "r1" and out["samples"] == 4 and out["latency_ms"] == 12.5
    assert out["time"].endswith("Z")
