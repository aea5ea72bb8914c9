"""Trace confidence from top-k log-probs (DeepConf's measure; formulas in :mod:`allocators.deepconf`).

:class:`TraceMonitor` follows one trace token by token: ``C_t = -(1/k) sum_{j<=k} log p_t(j)``, the
group confidence is the mean of ``C`` over the last ``window`` tokens, and ``lowest`` is the least
group confidence seen (a trace shorter than the window has one group: all of it, taken at
:meth:`TraceMonitor.finish`). Each token costs O(1). :func:`trace_confidence` runs a monitor over a
finished sample's log-probs; the engine gives a streamed sample's monitor to the backend stream
(``Progress.watch``), which stops the sample when the monitor says so.

Recorded traffic keeps each sample's ``C_t`` trace (:func:`token_confidences`,
:func:`encode_trace`: one byte per token), and replay turns it back into log-prob objects
(:func:`trace_token`, :func:`trace_logprobs`) that the same monitor reads: ``deepconf`` offline.
"""

from __future__ import annotations

import base64
from collections import deque
from collections.abc import Callable
from typing import Any


class TraceMonitor:
    """Sliding-window group confidence of one trace; ``cut_below()`` (read once it returns a number)
    is the threshold under which :meth:`__call__` asks to cut."""

    def __init__(self, window: int, top_k: int, cut_below: Callable[[], float | None] | None = None) -> None:
        self.window = window
        self.top_k = top_k
        self._cut_below = cut_below
        self._threshold: float | None = None
        self._recent: deque[float] = deque()
        self._sum = 0.0
        self.tokens = 0
        self.lowest: float | None = None

    def __call__(self, top: list[float]) -> bool:
        """Add one token's top-k log-probs (a token without them is skipped); whether the trace should
        be cut now."""
        vals = top[: self.top_k]
        if not vals:
            return False
        c = -sum(vals) / len(vals)
        self._recent.append(c)
        self._sum += c
        self.tokens += 1
        if len(self._recent) > self.window:
            self._sum -= self._recent.popleft()
        if len(self._recent) < self.window:
            return False
        group = self._sum / self.window
        if self.lowest is None or group < self.lowest:
            self.lowest = group
        if self._threshold is None and self._cut_below is not None:
            self._threshold = self._cut_below()
        return self._threshold is not None and group < self._threshold

    def finish(self) -> float | None:
        """The trace's lowest group confidence (``None`` without tokens)."""
        if self.lowest is None and self._recent:
            self.lowest = self._sum / len(self._recent)
        return self.lowest


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
    """The lowest group confidence of a finished (or cut) sample."""
    monitor = TraceMonitor(window, top_k)
    for top in token_top_logprobs(logprobs, kind):
        monitor(top)
    return monitor.finish()


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


def trace_token(c: float, kind: str) -> dict[str, Any]:
    """One token's log-prob object, as a stream chunk carries it, whose alternatives average to ``C_t
    = c`` (what :class:`TraceMonitor` reads): a recorded trace replayed through the live code path."""
    if kind == "chat":
        return {"content": [{"top_logprobs": [{"logprob": -c}]}]}
    return {"top_logprobs": [{"": -c}]}


def trace_logprobs(values: list[float], kind: str) -> dict[str, Any]:
    """A whole sample's log-prob object for a recorded trace (see :func:`trace_token`)."""
    if kind == "chat":
        return {"content": [{"top_logprobs": [{"logprob": -c}]} for c in values]}
    return {"top_logprobs": [{"": -c} for c in values]}


def stream_watcher(monitor: TraceMonitor, kind: str) -> Callable[[Any], bool]:
    """A stream watcher feeding each chunk's tokens to ``monitor``; ``True`` once it asks to cut."""
    def watch(logprobs: Any) -> bool:
        cut = False
        for top in token_top_logprobs(logprobs, kind):
            cut = monitor(top) or cut
        return cut

    return watch
