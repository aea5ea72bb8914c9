"""DeepConf's confidence of a running trace (Fu et al., 2025, "Deep Think with Confidence").

Token confidence at step ``t`` over the ``k`` most likely tokens of the step's distribution:
``C_t = -(1/k) * sum_{j<=k} log p_t(j)`` (large when the model is sure: its alternatives are improbable).
Group confidence at ``t``: the mean of ``C`` over the last ``window`` tokens, defined once ``window``
tokens have been seen. A trace's *lowest* group confidence is the least of them (a trace shorter than
the window has one group: all of it). A monitor cuts a trace at the first step whose group confidence
is below the threshold. Every step costs O(1).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable


def token_confidence(top_logprobs: Iterable[float]) -> float | None:
    """``C_t`` from the log-probs of a step's top alternatives (``None`` without any)."""
    values = list(top_logprobs)
    return -sum(values) / len(values) if values else None


class GroupConfidence:
    """The sliding-window group confidence of one trace (see the module doc).

    :meth:`add` takes one token's confidence. ``pos`` (optional) is the token's position in the trace:
    a value for the position added last replaces it instead of adding a token (a step computed twice,
    e.g. a prefill chunk before the first token, counts once)."""

    __slots__ = ("_last_pos", "_sum", "_values", "lowest", "tokens", "window")

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError("window must be >= 1")
        self.window = window
        self._values: deque[float] = deque()
        self._sum = 0.0
        self._last_pos: int | None = None
        self.tokens = 0
        self.lowest: float | None = None
        """The least group confidence seen so far (``None`` before the first full window)."""

    def add(self, c: float, pos: int | None = None) -> float | None:
        """Add ``C_t``; the group confidence now (``None`` while fewer than ``window`` tokens)."""
        if pos is not None and pos == self._last_pos and self._values:
            self._sum -= self._values.pop()
        else:
            self.tokens += 1
        self._last_pos = pos
        self._values.append(c)
        self._sum += c
        if len(self._values) > self.window:
            self._sum -= self._values.popleft()
        if len(self._values) < self.window:
            return None
        group = self._sum / self.window
        if self.lowest is None or group < self.lowest:
            self.lowest = group
        return group

    def below(self, c: float, threshold: float, pos: int | None = None) -> bool:
        """Add ``C_t``; whether the group confidence is now under ``threshold`` (the cut rule)."""
        group = self.add(c, pos)
        return group is not None and group < threshold

    def finish(self) -> float | None:
        """The trace's lowest group confidence (a trace shorter than the window: its mean; ``None``
        without tokens)."""
        if self.lowest is None and self._values:
            return self._sum / len(self._values)
        return self.lowest


def first_cut(confidences: Iterable[float], window: int, threshold: float) -> int | None:
    """The index of the first token whose group confidence is under ``threshold`` (where a monitor
    cuts the trace: that step's token becomes the marker), ``None`` when none is."""
    group = GroupConfidence(window)
    for i, c in enumerate(confidences):
        if group.below(c, threshold):
            return i
    return None
