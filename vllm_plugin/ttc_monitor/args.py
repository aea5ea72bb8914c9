"""The per-request arguments of the monitor, as the service sends them in ``vllm_xargs`` (vLLM's
``SamplingParams.extra_args``: a flat mapping of strings and numbers).

========================  ======================================================================
``ttc_monitor_threshold``  group confidence under which the trace is cut (switches the monitor on)
``ttc_monitor_marker``     token id forced at the cut; the request must list it in ``stop_token_ids``
                           so that the trace ends there (``finish_reason: stop``, ``stop_reason``: the id)
``ttc_monitor_window``     tokens of the sliding window (default 16; 1..4096)
``ttc_monitor_top_k``      alternatives in a token's confidence (default 5; 1..20)
========================  ======================================================================

A request without ``ttc_monitor_threshold`` is not monitored (the other keys then must be absent too).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

PREFIX = "ttc_monitor_"
WINDOW_MAX = 4096
TOP_K_MAX = 20


@dataclass(frozen=True, slots=True)
class MonitorArgs:
    """A validated monitor request (see the module doc)."""

    threshold: float
    marker: int
    window: int = 16
    top_k: int = 5

    def as_xargs(self) -> dict[str, int | float]:
        """The ``vllm_xargs`` entries that ask for this monitor."""
        return {PREFIX + "threshold": self.threshold, PREFIX + "marker": self.marker,
                PREFIX + "window": self.window, PREFIX + "top_k": self.top_k}


def _int(args: Mapping[str, Any], name: str, default: int | None, lo: int, hi: int | None) -> int:
    value = args.get(PREFIX + name, default)
    if value is None:
        raise ValueError(f"{PREFIX}{name} is required with {PREFIX}threshold")
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise ValueError(f"{PREFIX}{name} must be an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        raise ValueError(f"{PREFIX}{name} must be in {lo}..{hi if hi is not None else 'the vocabulary'}, "
                         f"got {value!r}")
    return int(value)


def parse(extra_args: Mapping[str, Any] | None, stop_token_ids: Collection[int] | None = None) -> MonitorArgs | None:
    """The monitor a request asks for (``None``: none); ``ValueError`` naming the argument when an
    argument is unknown, of the wrong type or out of range, or the marker is not a stop token."""
    ours = {k: v for k, v in (extra_args or {}).items() if k.startswith(PREFIX)}
    if not ours:
        return None
    unknown = sorted(set(ours) - {PREFIX + n for n in ("threshold", "marker", "window", "top_k")})
    if unknown:
        raise ValueError(f"unknown monitor argument {unknown[0]} (known: {PREFIX}threshold, {PREFIX}marker, "
                         f"{PREFIX}window, {PREFIX}top_k)")
    threshold = ours.get(PREFIX + "threshold")
    if threshold is None:
        raise ValueError(f"{PREFIX}threshold is required to monitor a trace")
    if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not math.isfinite(threshold) \
            or threshold < 0:
        raise ValueError(f"{PREFIX}threshold must be a finite number >= 0, got {threshold!r}")
    marker = _int(ours, "marker", None, 0, None)
    if stop_token_ids is not None and marker not in stop_token_ids:
        raise ValueError(f"{PREFIX}marker {marker} must be one of the request's stop_token_ids (the trace ends there)")
    return MonitorArgs(float(threshold), marker, _int(ours, "window", 16, 1, WINDOW_MAX),
                       _int(ours, "top_k", 5, 1, TOP_K_MAX))
