"""``deepconf``: DeepConf's online mode (Fu et al., 2025): traces whose confidence drops are stopped.

Token confidence is ``C_t = -(1/k) sum_{j<=k} log p_t(j)`` over the ``top_k`` most likely tokens at
step ``t`` (large when the model is sure: the alternatives are improbable); a trace's group
confidence at ``t`` is the mean of ``C`` over the last ``window`` tokens, and its *lowest* group
confidence over the trace is ``Sample.confidence`` (the engine measures it from streamed top-k
log-probs; a trace shorter than the window has one group, its whole length).

Online mode: the first ``warmup`` traces of a query run to their end; the cut threshold is the
``100 - keep`` percentile of their lowest group confidences (``keep`` 90: DeepConf-high, which stops
only the least confident traces; 10: DeepConf-low). From then on a running trace whose group
confidence falls below the threshold is cut (:meth:`DeepConf.cut_below`); a cut trace does not vote
(it is a truncated sample). Consensus ends the query: after warmup, when the leading answer holds at
least ``consensus`` of the votes (each weighted by its trace's lowest group confidence) or at
``max_samples``. A ``fixed`` threshold skips the warmup percentile.
"""

from __future__ import annotations

import math

from pydantic import Field, model_validator

from .base import QueryState
from .single import PerQueryAllocator, StoppingParams


class DeepConfParams(StoppingParams):
    """DeepConf online: warm up, cut traces below the warmup percentile, stop on weighted consensus."""

    warmup: int = Field(4, ge=1, le=1024, description="Traces of a query that run whole and set the threshold.")
    keep: float = Field(90.0, gt=0.0, le=100.0,
                        description="Percent of warmup traces the threshold keeps (90: cut the least confident).")
    fixed: float | None = Field(None, ge=0.0, le=100.0, description="A fixed cut threshold instead of the warmup's.")
    window: int = Field(16, ge=1, le=4096, description="Tokens of the sliding window of group confidence.")
    top_k: int = Field(5, ge=1, le=20, description="Alternatives per token in token confidence.")
    consensus: float = Field(0.95, gt=0.5, le=1.0, description="Stop once the leader holds this share of the vote.")
    max_samples: int = Field(32, ge=1, le=1024, description="Traces per query at most.")
    step: int = Field(2, ge=1, le=1024, description="Traces asked for at a time after warmup.")

    @model_validator(mode="after")
    def _warmup_le_max(self) -> DeepConfParams:
        if self.warmup > self.max_samples:
            raise ValueError("warmup must be <= max_samples")
        return self


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by linear interpolation between order statistics."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


class DeepConf(PerQueryAllocator):
    """See the module doc. ``want``: the warmup first, then ``step`` at a time until consensus."""

    name = "deepconf"
    Params = DeepConfParams
    params: DeepConfParams

    def trace_monitor(self) -> tuple[int, int] | None:
        return self.params.window, self.params.top_k

    def cut_below(self, state: QueryState) -> float | None:
        """The group confidence under which a running trace of ``state`` is cut (``None``: warming up)."""
        p = self.params
        if p.fixed is not None:
            return p.fixed
        warm = [s.confidence for s in state.samples[: p.warmup] if s.confidence is not None]
        if len(warm) < p.warmup:
            return None
        return percentile(warm, 100.0 - p.keep)

    def _consensus(self, state: QueryState) -> bool:
        weights: dict[str, float] = {}
        for s in state.samples:
            if s.answer is not None:
                weights[s.answer] = weights.get(s.answer, 0.0) + (s.confidence if s.confidence is not None else 1.0)
        total = sum(weights.values())
        return total > 0 and max(weights.values()) / total >= self.params.consensus

    def want(self, state: QueryState) -> int:
        p = self.params
        n = state.spent
        if n >= p.max_samples:
            return 0
        if n < p.warmup:
            return p.warmup - n
        if self._consensus(state):
            return 0
        return min(p.step, p.max_samples - n)
