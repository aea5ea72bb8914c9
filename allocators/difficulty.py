"""``difficulty``: a learned predictor of single-sample success decides how many samples a query gets.

Shared across requests (``shared = True``): the service keeps one instance per policy version and
feeds it finished queries through :meth:`Difficulty.learn`. The instance holds only the model; a
plan is a function of the states, the budget and the model, so concurrent runs do not interfere.
The model's state (bias, weights, examples seen, RNG) travels as :meth:`Difficulty.state_dict`.
"""

from __future__ import annotations

import heapq
import math
import random
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import Any

from pydantic import Field, model_validator

from .base import Allocator, Budget, Plan, QueryState
from .budgeting import BudgetParams, limit_for, proportional_split, water_fill


def _phi(v: float) -> float:
    return math.copysign(math.log1p(abs(v)), v)


def _sigmoid(z: float) -> float:
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


class OnlineLogistic:
    """``p(x) = sigmoid(bias + sum_j w_j * phi(x_j))`` with ``phi(v) = sign(v) * ln(1 + |v|)``.

    Trained by one SGD step on the log-loss per example, with soft labels ``y`` in [0, 1]:
    ``w_j += lr * (y - p) * phi(x_j)``, ``bias += lr * (y - p)``. The bias starts at
    ``logit(prior)``; a feature seen for the first time (in :meth:`update`, names in sorted order)
    gets a weight drawn from ``N(0, init_scale^2)`` with the injected RNG; unseen features weigh 0.
    """

    def __init__(self, prior: float, lr: float, rng: random.Random, init_scale: float = 0.01) -> None:
        self.bias = math.log(prior / (1.0 - prior))
        self.lr = lr
        self.rng = rng
        self.init_scale = init_scale
        self.weights: dict[str, float] = {}
        self.seen = 0

    def predict(self, features: Mapping[str, float]) -> float:
        z = self.bias
        w = self.weights
        for name, v in features.items():
            if name in w:
                z += w[name] * _phi(v)
        return _sigmoid(z)

    def update(self, features: Mapping[str, float], y: float) -> None:
        for name in sorted(features):
            if name not in self.weights:
                self.weights[name] = self.rng.gauss(0.0, self.init_scale)
        g = self.lr * (y - self.predict(features))
        self.bias += g
        for name, v in features.items():
            self.weights[name] += g * _phi(v)
        self.seen += 1

    def state_dict(self) -> dict[str, Any]:
        """``{"bias", "weights", "seen", "rng"}``, ``rng`` being ``random.Random.getstate()`` as JSON
        lists (the RNG draws the weights of features seen later, so it is part of the state)."""
        version, internal, gauss_next = self.rng.getstate()
        return {"bias": self.bias, "weights": dict(self.weights), "seen": self.seen,
                "rng": [version, list(internal), gauss_next]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take back :meth:`state_dict` (the RNG is restored in place: whoever shares it sees the new
        state). Nothing changes when ``state`` is malformed (``ValueError``)."""
        if set(state) != {"bias", "weights", "seen", "rng"}:
            raise ValueError(f"a difficulty state has bias, weights, seen and rng; got {sorted(state)}")
        bias, weights, seen, rng = state["bias"], state["weights"], state["seen"], state["rng"]
        if not _real(bias) or not isinstance(weights, Mapping) or not all(
                isinstance(k, str) and _real(v) for k, v in weights.items()):
            raise ValueError("bias and weights must be finite numbers (weights keyed by feature name)")
        if not isinstance(seen, int) or isinstance(seen, bool) or seen < 0:
            raise ValueError("seen must be a non-negative integer")
        if (not isinstance(rng, Sequence) or len(rng) != 3 or not isinstance(rng[1], Sequence)
                or not (rng[2] is None or _real(rng[2]))):
            raise ValueError("rng must be [version, internal state, gauss_next] (random.Random.getstate())")
        restored = random.Random()
        try:
            restored.setstate((rng[0], tuple(rng[1]), rng[2]))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"rng is not a random.Random state: {exc}") from None
        self.rng.setstate(restored.getstate())
        self.bias = float(bias)
        self.weights = {k: float(v) for k, v in weights.items()}
        self.seen = seen


def _real(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def majority_accuracy(n: int, p: float) -> float:
    """Accuracy of a majority vote over ``n`` samples, each right with probability ``p``.

    The simple model: answers are right or wrong, the majority wins, ties are broken by a coin:
    ``acc(n) = P(X > n/2) + P(X = n/2) / 2`` with ``X ~ Binomial(n, p)``; ``acc(0) = 0``.
    """
    if n == 0:
        return 0.0
    total = 0.0
    for j in range(n + 1):
        pmf = math.comb(n, j) * p**j * (1.0 - p) ** (n - j)
        if 2 * j > n:
            total += pmf
        elif 2 * j == n:
            total += pmf / 2
    return total


def majority_gain(n: int, p: float) -> float:
    """Expected accuracy gain per extra sample at ``n`` samples: ``(acc(n + 2) - acc(n)) / 2``.

    Under :func:`majority_accuracy`, ``acc(2m) = acc(2m - 1)`` and
    ``acc(2m + 1) - acc(2m - 1) = C(2m - 1, m) (p q)^m (p - q)`` (``q = 1 - p``), so with
    ``m = ceil(n / 2)`` the gain is ``C(2m - 1, m) (p q)^m (p - q) / 2``; the first sample gains ``p``.
    The gain is decreasing in ``n`` (so a greedy split is optimal) and negative when ``p < 1/2``.
    """
    if n == 0:
        return p
    q = 1.0 - p
    if p <= 0.0 or q <= 0.0:
        return 0.0
    m = (n + 1) // 2
    log_c = math.lgamma(2 * m) - math.lgamma(m + 1) - math.lgamma(m)
    return math.exp(log_c + m * math.log(p * q)) * (p - q) / 2.0


class DifficultyParams(BudgetParams):
    """Predict single-sample success, bin it into an initial allocation, split budgets greedily."""

    prior_success: float = Field(0.6, gt=0.0, lt=1.0, description="Predicted success before any learning.")
    learning_rate: float = Field(0.05, gt=0.0, le=1.0, description="SGD step of the online model.")
    prior_strength: float = Field(
        2.0, ge=0.0, le=100.0, description="Pseudo-votes of the prediction when blended with observed votes."
    )
    success_edges: tuple[float, ...] = Field(
        (0.3, 0.6, 0.85), min_length=1, max_length=16, description="Ascending success-probability bin edges."
    )
    bin_samples: tuple[int, ...] = Field(
        (4, 16, 8, 3), min_length=2, max_length=17, description="Samples per bin (one more than edges)."
    )
    initial_fraction: float = Field(
        0.5, gt=0.0, le=1.0, description="Batch: share of the budget the first (binned) round may use."
    )
    round_fraction: float = Field(
        0.5, gt=0.0, le=1.0, description="Batch: share of the remaining budget each greedy round splits."
    )
    min_gain: float = Field(1e-3, ge=0.0, le=1.0, description="Greedy: smallest accuracy gain worth a sample.")
    max_samples: int = Field(64, ge=1, le=1024, description="Samples per query at most.")

    @model_validator(mode="after")
    def _bins(self) -> DifficultyParams:
        edges = self.success_edges
        if any(not 0.0 < e < 1.0 for e in edges) or any(b <= a for a, b in pairwise(edges)):
            raise ValueError("success_edges must be strictly increasing, inside (0, 1)")
        if len(self.bin_samples) != len(edges) + 1 or any(not 1 <= s <= 1024 for s in self.bin_samples):
            raise ValueError("bin_samples needs len(success_edges) + 1 entries in [1, 1024]")
        return self


class Difficulty(Allocator):
    """Allocation from predicted difficulty, learned online.

    Prediction: ``p0`` = ``1 - prior_difficulty`` when the engine supplies one, else
    :class:`OnlineLogistic` on ``QueryState.features``. After votes, the estimate blends in the vote
    spread: ``p = (s0 * p0 + a) / (s0 + n)`` (``a``: leader's votes, ``n``: samples,
    ``s0 = prior_strength``). :meth:`learn` trains on finished queries with label ``y`` = mean verifier
    score when every sample is scored, else the leader's share ``a / n`` (agreement).

    * No sample budget (streaming, one query at a time): a query's target is ``bin_samples[bin(p)]``
      (bins cut by ``success_edges``); rounds draw ``target - n`` until the target is reached.
    * Batch budget ``B``: the first round gives the new queries their binned sizes, scaled to fit
      ``max(new, floor(initial_fraction * B))`` (one each first, the rest in proportion); later rounds
      split ``ceil(round_fraction * B)`` greedily by :func:`majority_gain`, skipping gains below
      ``min_gain``.
    """

    name = "difficulty"
    uses_features = True
    Params = DifficultyParams
    params: DifficultyParams
    shared = True

    def __init__(self, params: DifficultyParams, rng: random.Random) -> None:
        super().__init__(params, rng)
        self.model = OnlineLogistic(params.prior_success, params.learning_rate, rng)

    def state_dict(self) -> dict[str, Any]:
        """The model's state (:meth:`OnlineLogistic.state_dict`): bias, weights, seen and the RNG."""
        return self.model.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.model.load_state_dict(state)

    def predict(self, state: QueryState) -> float:
        """Predicted single-sample success before votes, ``p0``."""
        if state.prior_difficulty is not None:
            return min(1.0, max(0.0, 1.0 - state.prior_difficulty))
        return self.model.predict(state.features)

    def estimate(self, state: QueryState) -> float:
        """Success estimate after the votes so far: ``(s0 * p0 + a) / (s0 + n)``."""
        s0, n = self.params.prior_strength, state.spent
        p0 = self.predict(state)
        if s0 + n == 0:
            return p0
        return (s0 * p0 + state.top_two()[0]) / (s0 + n)

    def bin_target(self, p: float) -> int:
        return self.params.bin_samples[bisect_right(self.params.success_edges, p)]

    def plan(self, states: Sequence[QueryState], budget: Budget) -> Plan:
        p = self.params
        rows = [(st, min(st.cap, p.max_samples) - st.spent) for st in states]
        rows = [(st, room) for st, room in rows if room > 0]
        if not rows:
            return {}
        limit = limit_for(budget, states, p.tokens_per_sample)
        if limit is None:
            plan: Plan = {}
            for st, room in rows:
                w = min(self.bin_target(self.estimate(st)) - st.spent, room)
                if w > 0:
                    plan[st.id] = w
            return plan
        if limit <= 0:
            return {}
        new = [(st, room) for st, room in rows if st.spent == 0]
        if new:
            return self._first_round(new, limit)
        return self._greedy(rows, min(limit, max(1, math.ceil(p.round_fraction * limit))))

    def _first_round(self, new: list[tuple[QueryState, int]], limit: int) -> Plan:
        ids = [st.id for st, _ in new]
        sizes = [min(self.bin_target(self.predict(st)), room) for st, room in new]
        total = min(limit, max(len(new), math.floor(self.params.initial_fraction * limit)))
        if sum(sizes) <= total or total <= len(new):
            return water_fill(ids, sizes, total)
        extra = proportional_split([s - 1 for s in sizes], [s - 1 for s in sizes], total - len(new))
        return {i: 1 + x for i, x in zip(ids, extra, strict=True)}

    def _greedy(self, rows: list[tuple[QueryState, int]], units: int) -> Plan:
        min_gain = self.params.min_gain
        est = [self.estimate(st) for st, _ in rows]
        given = [0] * len(rows)
        heap = []
        for i, (st, _) in enumerate(rows):
            g = majority_gain(st.spent, est[i])
            if g >= min_gain and g > 0:
                heap.append((-g, i))
        heapq.heapify(heap)
        while units > 0 and heap:
            _, i = heapq.heappop(heap)
            given[i] += 1
            units -= 1
            st, room = rows[i]
            if given[i] < room:
                g = majority_gain(st.spent + given[i], est[i])
                if g >= min_gain and g > 0:
                    heapq.heappush(heap, (-g, i))
        return {st.id: x for (st, _), x in zip(rows, given, strict=True) if x > 0}

    def learn(self, finished: Sequence[QueryState]) -> None:
        for st in finished:
            n = st.spent
            if n == 0:
                continue
            scores = [s.score for s in st.samples if s.score is not None]
            y = sum(scores) / n if len(scores) == n else st.top_two()[0] / n
            self.model.update(st.features, min(1.0, max(0.0, y)))
