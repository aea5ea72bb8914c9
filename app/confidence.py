"""Trace confidence from top-k log-probs (DeepConf's measure; formulas in :mod:`ttc_monitor.window`,
the one implementation the service and the engine's monitor share).

:func:`trace_confidence` is a finished sample's lowest sliding-window group confidence, from the
top-k log-probs the backend returned with it (``Sample.confidence``). Running traces are cut inside
the engine (:class:`~app.backends.base.TraceCut`, the ``ttc_monitor`` vLLM plugin), never here.

Recorded traffic keeps each sample's ``C_t`` trace (:func:`token_confidences`,
:func:`encode_trace`: one byte per token), and replay turns it back into log-prob objects
(:func:`trace_logprobs`) and cuts it where the engine would have (:func:`ttc_monitor.window.first_cut`):
``deepconf`` offline.
"""

from __future__ import annotations

import base64
from typing import Any

from ttc_monitor.window import GroupConfidence, token_confidence


def token_top_logprobs(logprobs: Any, kind: str) -> list[list[float]]:
    """Per token, the log-probs of its top alternatives, from an OpenAI log-prob object (chat:
    ``content[].top_logprobs[].logprob``; completions: ``top_logprobs[]`` as ``{token: logprob}``);
    ``[]`` for a token reported without alternatives (its own log-prob alone says nothing of them)."""
    out: list[list[float]] = []
    if not logprobs:
        return out
    if kind == "chat":
        for entry in logprobs.get("content") or []:
            alts = [a.get("logprob") for a in entry.get("top_logprobs") or [] if isinstance(a, dict)]
            out.append([float(v) for v in alts if isinstance(v, int | float)])
        return out
    for alts in logprobs.get("top_logprobs") or []:
        values = alts.values() if isinstance(alts, dict) else []
        out.append([float(v) for v in values if isinstance(v, int | float)])
    return out


def trace_confidence(logprobs: Any, kind: str, window: int, top_k: int) -> float | None:
    """The lowest group confidence of a finished (or cut) sample, from its top-``top_k`` log-probs."""
    group = GroupConfidence(window)
    for top in token_top_logprobs(logprobs, kind):
        c = token_confidence(top[:top_k])
        if c is not None:
            group.add(c)
    return group.finish()


TRACE_STEP = 0.1
"""Resolution of a recorded trace: one byte per token, the token confidence in units of 0.1 (clipped
to 0..25.5; the demo model's confident tokens sit well below the top)."""


def token_confidences(logprobs: Any, kind: str) -> list[float] | None:
    """``C_t`` of every token over all the alternatives reported for it (``None`` when a token came
    without alternatives: the call did not ask for top log-probs)."""
    tops = token_top_logprobs(logprobs, kind)
    if not tops or not all(tops):
        return None
    return [-sum(top) / len(top) for top in tops]


def encode_trace(values: list[float]) -> str:
    """A trace of token confidences as base64, one byte per token (see :data:`TRACE_STEP`)."""
    return base64.b64encode(bytes(min(255, max(0, round(c / TRACE_STEP))) for c in values)).decode("ascii")


def decode_trace(text: str) -> list[float]:
    """The token confidences of :func:`encode_trace` (``ValueError`` for text that is not base64)."""
    return [b * TRACE_STEP for b in base64.b64decode(text, validate=True)]


def trace_logprobs(values: list[float], kind: str) -> dict[str, Any]:
    """A whole sample's log-prob object for a recorded trace: per token one alternative of log-prob
    ``-c``, so its confidence over its alternatives is ``c`` again (what :func:`trace_confidence` reads)."""
    if kind == "chat":
        return {"content": [{"top_logprobs": [{"logprob": -c}]} for c in values]}
    return {"top_logprobs": [{"": -c} for c in values]}
