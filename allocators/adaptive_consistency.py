"""``adaptive_consistency``: Adaptive-Consistency (Aggarwal et al., 2023) with the Beta stopping rule."""

from __future__ import annotations

import random

from pydantic import Field, model_validator

from .base import QueryState
from .single import PerQueryAllocator, StoppingParams
from .stats import BetaRule


class AdaptiveConsistencyParams(StoppingParams):
    """Sample until the Beta rule is confident the leading answer is the majority.

    Stop when ``spent >= min_samples`` and ``P(p1 > p2 | votes) = I_{1/2}(b + 1, a + 1) >= threshold``
    (``a``, ``b``: top-two vote counts), or at ``max_samples``.
    """

    threshold: float = Field(0.95, gt=0.5, lt=1.0, description="Stop when P(leader is the majority) >= this.")
    min_samples: int = Field(2, ge=1, le=1024, description="Samples before the rule may stop.")
    max_samples: int = Field(40, ge=1, le=1024, description="Samples per query at most.")
    per_round: int = Field(1, ge=1, le=1024, description="Samples per query per round, at least.")
    lookahead: bool = Field(
        True,
        description="Draw in one round all samples the rule needs before it could possibly fire "
        "(same total samples as one at a time, fewer rounds).",
    )

    @model_validator(mode="after")
    def _min_le_max(self) -> AdaptiveConsistencyParams:
        if self.min_samples > self.max_samples:
            raise ValueError("min_samples must be <= max_samples")
        return self


class AdaptiveConsistency(PerQueryAllocator):
    """Adaptive-Consistency's Beta rule, per query.

    With ``a`` votes for the leading answer and ``b`` for the runner-up, the leader's share of the two
    is ``p ~ Beta(a + 1, b + 1)`` and the query stops when
    ``P(p > 1/2) = I_{1/2}(b + 1, a + 1) = 2^-(a+b+1) sum_{j<=a} C(a+b+1, j) >= threshold``
    (and ``spent >= min_samples``), or at ``max_samples``. E.g. with identical votes (b = 0) the rule
    fires at ``a = 3`` for threshold 0.9 (15/16) and ``a = 4`` for 0.95 (31/32).

    A round asks ``per_round`` samples, or with ``lookahead`` ``max(per_round, min_top(b) - a,
    min_samples - spent)``: the rule cannot fire before that many more samples, so drawing them at once
    spends exactly what one-at-a-time sampling would, in fewer rounds.
    """

    name = "adaptive_consistency"
    Params = AdaptiveConsistencyParams
    params: AdaptiveConsistencyParams

    def __init__(self, params: AdaptiveConsistencyParams, rng: random.Random) -> None:
        super().__init__(params, rng)
        self._rule = BetaRule(params.threshold, params.max_samples)

    def want(self, state: QueryState) -> int:
        p = self.params
        n = state.spent
        if n >= p.max_samples:
            return 0
        a, b = state.top_two()
        if n >= p.min_samples and self._rule.solved(a, b):
            return 0
        k = p.per_round
        if p.lookahead:
            k = max(k, self._rule.min_top(b) - a, p.min_samples - n)
        return min(k, p.max_samples - n)
