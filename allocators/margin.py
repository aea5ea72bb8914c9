"""``margin``: stop when the leading answer's weighted vote beats the runner-up's by a margin.

Each sample weighs its verifier score (with the ``likelihood`` verifier: the model's own probability
of the whole completion, ``exp(sum of token log-probs)``) or 1 when it has no score. Easy queries
stop after one confident sample; queries whose samples are unsure or disagree keep sampling up to the
cap. This is the rule behind the built-in ``confident`` policy (``likelihood`` verifier, weighted
majority vote).
"""

from __future__ import annotations

from pydantic import Field, model_validator

from .base import QueryState
from .single import PerQueryAllocator, StoppingParams


class MarginParams(StoppingParams):
    """Stop when ``W(leader) - W(runner-up) >= margin`` or at ``max_samples``."""

    margin: float = Field(
        0.5, gt=0.0, le=1024.0,
        description="Weighted-vote lead that ends sampling (in votes when samples carry no score).",
    )
    max_samples: int = Field(12, ge=1, le=1024, description="Samples per query at most.")
    first: int = Field(1, ge=1, le=1024, description="Samples in the first round.")
    step: int = Field(2, ge=1, le=1024, description="Samples per later round.")

    @model_validator(mode="after")
    def _first_le_max(self) -> MarginParams:
        if self.first > self.max_samples:
            raise ValueError("first must be <= max_samples")
        return self


def weighted_lead(state: QueryState) -> float:
    """``W(a1) - W(a2)``: the two largest per-answer weight sums, ``W(a) = sum_{i: answer_i = a} w_i``
    with ``w_i`` the sample's score (1 when unscored); samples without an answer do not count; 0 for a
    missing runner-up."""
    weights: dict[str, float] = {}
    for s in state.samples:
        if s.answer is not None:
            weights[s.answer] = weights.get(s.answer, 0.0) + (1.0 if s.score is None else s.score)
    top = second = 0.0
    for w in weights.values():
        if w > top:
            top, second = w, top
        elif w > second:
            second = w
    return top - second


class Margin(PerQueryAllocator):
    """Weighted-vote margin stopping, per query.

    Round 1 draws ``first`` samples, later rounds ``step`` (never past ``max_samples``). After each
    round the query stops when :func:`weighted_lead` ``>= margin``. With ``margin <= 1`` and
    likelihood scores, one sample the model produced with probability ``>= margin`` settles a query.
    """

    name = "margin"
    Params = MarginParams
    params: MarginParams

    def margin_now(self) -> float:
        """The lead that ends sampling now: ``params.margin`` (a learned one in
        :class:`~allocators.calibrated.CalibratedMargin`)."""
        return self.params.margin

    def want(self, state: QueryState) -> int:
        p = self.params
        n = state.spent
        if n >= p.max_samples:
            return 0
        if n == 0:
            return p.first
        if weighted_lead(state) >= self.margin_now():
            return 0
        return min(p.step, p.max_samples - n)
