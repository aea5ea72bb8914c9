"""What the load tester records about one request, and how a response body is read into it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class RequestRecord:
    """One request. Times are seconds; ``start_s``/``end_s`` are offsets from the level's start.

    ``error`` is ``None`` on success, else a type such as ``http_504:deadline_exceeded``,
    ``timeout``, ``connect_error`` or ``bad_response``; ``error_message`` then says what the service
    (or the client library) said, cut to :data:`MAX_ERROR_MESSAGE` characters. ``correct`` is filled
    in after the run (scoring is kept out of the timed path); it stays ``None`` when there is no gold
    answer.
    """

    policy: str
    mode: str
    load: float
    index: int
    problem_id: str
    gold: str | None
    start_s: float
    end_s: float = 0.0
    latency_s: float = 0.0
    ttfb_s: float | None = None
    status: int | None = None
    error: str | None = None
    error_message: str | None = None
    samples: int | None = None
    rounds: int | None = None
    stop_reason: str | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    answer: str | None = None
    content: str | None = None
    correct: bool | None = None

    def row(self) -> dict[str, Any]:
        return asdict(self)


MAX_ERROR_MESSAGE = 300


def clip(text: str, limit: int = MAX_ERROR_MESSAGE) -> str:
    """``text`` on one line, at most ``limit`` characters (an ellipsis marks a cut)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def error_message(body: bytes) -> str:
    """What an error response says: the OpenAI envelope's ``error.message``, else the body's start."""
    try:
        err = json.loads(body).get("error")
        if isinstance(err, dict) and err.get("message"):
            return clip(str(err["message"]))
        if isinstance(err, str) and err:
            return clip(err)
    except (ValueError, AttributeError):
        pass
    return clip(body.decode("utf-8", "replace")) or "(empty body)"


def error_type(status: int, body: bytes) -> str:
    """``http_<status>`` plus the OpenAI error ``type``/``code`` when the body carries one."""
    kind = ""
    try:
        err = json.loads(body).get("error")
        if isinstance(err, dict):
            kind = str(err.get("code") or err.get("type") or "")
    except (ValueError, AttributeError):
        pass
    return f"http_{status}:{kind}" if kind else f"http_{status}"


def apply_json(rec: RequestRecord, payload: dict[str, Any]) -> None:
    """Fill ``rec`` from a non-streamed OpenAI response (with or without a ``ttc`` block)."""
    choices = payload.get("choices") or []
    if choices:
        ch = choices[0]
        msg = ch.get("message")
        rec.content = msg.get("content") if isinstance(msg, dict) else ch.get("text")
    _apply_usage(rec, payload.get("usage"))
    _apply_ttc(rec, payload.get("ttc"))


def apply_sse(rec: RequestRecord, events: list[dict[str, Any]]) -> None:
    """Fill ``rec`` from decoded SSE ``data:`` objects: content deltas concatenated, the last
    ``ttc`` block and ``usage`` kept; an ``error`` event marks the request failed."""
    parts: list[str] = []
    for ev in events:
        if "error" in ev:
            err = ev["error"]
            code = err.get("code") or err.get("type") if isinstance(err, dict) else None
            rec.error = f"stream_error:{code}" if code else "stream_error"
            message = err.get("message") if isinstance(err, dict) else err
            rec.error_message = clip(str(message)) if message else None
        for ch in ev.get("choices") or []:
            delta = ch.get("delta") or {}
            if isinstance(delta.get("content"), str):
                parts.append(delta["content"])
            elif isinstance(ch.get("text"), str):
                parts.append(ch["text"])
        _apply_usage(rec, ev.get("usage"))
        _apply_ttc(rec, ev.get("ttc"))
    rec.content = "".join(parts)


def _apply_usage(rec: RequestRecord, usage: Any) -> None:
    if isinstance(usage, dict):
        rec.completion_tokens = usage.get("completion_tokens")
        rec.total_tokens = usage.get("total_tokens")


def _apply_ttc(rec: RequestRecord, ttc: Any) -> None:
    if not isinstance(ttc, dict):
        return
    if "samples_drawn" in ttc:
        rec.samples = ttc.get("samples_drawn")
        rec.rounds = ttc.get("rounds")
        rec.stop_reason = ttc.get("stop_reason")
        rec.answer = ttc.get("answer")
    elif "samples" in ttc and isinstance(ttc["samples"], int):  # streamed progress chunk
        rec.samples = ttc["samples"]
