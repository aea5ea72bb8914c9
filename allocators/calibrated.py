"""``calibrated_margin``: the weighted-vote margin rule with its margin learned from traffic.

Why: with the ``likelihood`` verifier a sample's weight is the model's probability of the whole
completion, ``exp(sum of token log-probs)``, and that falls with the trace's length: a right answer
of the 64-token demo model weighs about 0.9, one of a 700-token reasoning trace about 0.1 or less.
A fixed margin (``margin``'s 0.5) therefore stops short traces after one sample and lets long ones
run to the cap whatever they say: the hard, long queries spend the tokens. Measured in the model's
own units instead, one rule serves both (a sequential threshold on the sequence likelihood, as in
DeepConf's online mode, Fu et al. 2025, "Deep Think with Confidence", where the stopping threshold
is a percentile of confidences seen in warm-up traces; here the warm-up is the traffic itself).

Rule, per query (rounds of ``first`` then ``step`` samples, up to ``max_samples``):

    W(a)   = sum of the scores of the samples answering a         (weighted vote, CISC-style)
    stop when W(a1) - W(a2) >= m,  m = Q_q(H)                      (a1, a2: the two heaviest answers)

``H`` holds the score of the first scored sample of each of the last ``history`` finished queries
(one per query, so queries that sample long do not drag the quantile down), ``Q_q`` its ``quantile``
``q`` (nearest rank, ``H_sorted[floor(q * (len(H) - 1))]``), floored at ``1e-12``. Until
``min_history`` queries have finished, ``m = margin`` (the fixed rule). With ``q = 0.65`` a query stops
once a sample at least as likely as 65% of the model's first answers leads by that much. The give-up
rules of :class:`~allocators.single.StoppingParams` apply as for every stopping policy.

Shared across requests (``shared = True``): the service keeps one instance per policy version and
feeds it finished queries (:meth:`learn`); :meth:`state_dict` is the history as floats.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import Field, model_validator

from .base import QueryState
from .margin import Margin, MarginParams

MARGIN_FLOOR = 1e-12
"""The smallest learned margin: a lead of exactly 0 (a lone unscored sample) never settles a query."""


class CalibratedMarginParams(MarginParams):
    """:class:`~allocators.margin.MarginParams` (``margin`` is the rule until ``min_history``) plus the
    quantile of the learned margin. Defaults were tuned on the project's recorded data only
    (``data/demo-thinking-n16.jsonl`` and ``data/demo-arith-n64.jsonl``, ``ttc replay``)."""

    quantile: float = Field(
        0.65, gt=0.0, lt=1.0,
        description="The margin is this quantile of the first sample's score over recent queries.")
    history: int = Field(256, ge=1, le=65536, description="Recent finished queries the quantile is taken over.")
    min_history: int = Field(
        16, ge=1, le=65536, description="Finished queries needed before the learned margin replaces 'margin'.")
    max_samples: int = Field(16, ge=1, le=1024, description="Samples per query at most.")
    step: int = Field(1, ge=1, le=1024, description="Samples per later round.")

    @model_validator(mode="after")
    def _min_history_le_history(self) -> CalibratedMarginParams:
        if self.min_history > self.history:
            raise ValueError("min_history must be <= history")
        return self


class CalibratedMargin(Margin):
    """:class:`~allocators.margin.Margin` whose margin is the ``quantile`` of first-sample scores of
    the last ``history`` finished queries (module doc: the formula, and why)."""

    name = "calibrated_margin"
    Params = CalibratedMarginParams
    params: CalibratedMarginParams
    shared = True

    def __init__(self, params: CalibratedMarginParams, rng: random.Random) -> None:
        super().__init__(params, rng)
        self._scores: deque[float] = deque(maxlen=params.history)
        self._margin = params.margin

    def margin_now(self) -> float:
        return self._margin

    def learn(self, finished: Sequence[QueryState]) -> None:
        """Adds each query's first scored, answered sample's score to the history and recomputes the margin."""
        for state in finished:
            first = next((s.score for s in state.samples if s.score is not None and s.answer is not None), None)
            if first is not None and math.isfinite(first):
                self._scores.append(min(1.0, max(0.0, first)))
        self._margin = self._learned()

    def _learned(self) -> float:
        p = self.params
        if len(self._scores) < p.min_history:
            return p.margin
        ordered = sorted(self._scores)
        return max(MARGIN_FLOOR, ordered[math.floor(p.quantile * (len(ordered) - 1))])

    def state_dict(self) -> dict[str, Any]:
        """``{"scores": [...]}``: the history, oldest first (the margin follows from it)."""
        return {"scores": list(self._scores)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        scores = state.get("scores")
        if set(state) != {"scores"} or not isinstance(scores, list):
            raise ValueError("calibrated_margin state must be {'scores': [numbers in [0, 1]]}")
        if not all(isinstance(v, int | float) and not isinstance(v, bool) and 0.0 <= v <= 1.0 for v in scores):
            raise ValueError("calibrated_margin state: every score must be a number in [0, 1]")
        if len(scores) > self.params.history:
            raise ValueError(f"calibrated_margin state holds {len(scores)} scores; history is {self.params.history}")
        self._scores = deque((float(v) for v in scores), maxlen=self.params.history)
        self._margin = self._learned()
