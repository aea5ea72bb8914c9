"""Vote statistics shared by the policies.

* :func:`beta_confidence` and :class:`BetaRule`: Adaptive-Consistency's Beta stopping rule, exact for
  integer vote counts, with a per-rule table so the check in the hot loop is one list lookup.
* :class:`VoteStats` and :class:`StatsCache`: per-query counts updated incrementally from the new
  samples only (samples are append-only between rounds), so a round over 10,000 queries touches each
  query's new samples once instead of recounting every vote.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .base import QueryState, Sample


def beta_confidence(a: int, b: int) -> float:
    """Probability that the leading answer's share beats the runner-up's, given the votes.

    With ``a`` votes for the leading answer and ``b`` for the runner-up, the leader's share of the two,
    ``p``, has the posterior ``Beta(a + 1, b + 1)`` under a uniform prior, and::

        P(p > 1/2) = I_{1/2}(b + 1, a + 1) = 2^-(a+b+1) * sum_{j=0}^{a} C(a+b+1, j)

    (the binomial-sum form of the regularized incomplete beta function, exact for integer arguments;
    the sum is taken in integers and divided once, so the result is correctly rounded).
    Example: ``beta_confidence(3, 0) == 15/16``.
    """
    if a < 0 or b < 0:
        raise ValueError("vote counts must be >= 0")
    n = a + b + 1
    term = 1  # C(n, 0)
    total = 1
    for j in range(a):
        term = term * (n - j) // (j + 1)  # C(n, j + 1)
        total += term
    return total / (1 << n)


#: ``XLOGX_STEPS[c] = c ln c - (c - 1) ln(c - 1)``: what one more vote adds to ``sum_c c ln c``.
XLOGX_STEPS: tuple[float, ...] = (0.0, 0.0, *(c * math.log(c) - (c - 1) * math.log(c - 1) for c in range(2, 1025)))
_N_STEPS = len(XLOGX_STEPS)


def xlogx_step(c: int) -> float:
    """``c ln c - (c - 1) ln(c - 1)`` (0 for ``c <= 1``)."""
    if c < len(XLOGX_STEPS):
        return XLOGX_STEPS[c]
    return c * math.log(c) - (c - 1) * math.log(c - 1)


class BetaRule:
    """The Beta stopping rule at a fixed ``threshold``: stop when ``beta_confidence(a, b) >= threshold``.

    ``min_top(b)`` is the smallest leader count ``a`` that satisfies the rule against a runner-up
    count ``b`` (``limit + 1`` when no ``a <= limit`` does); it is non-decreasing in ``b`` and cached
    in a list, so ``solved(a, b)`` is a lookup. ``min_top(b) - a`` is also the fewest further samples
    after which the rule could possibly fire (adding to the leader is the fastest way to stop).
    """

    __slots__ = ("_table", "limit", "threshold")

    def __init__(self, threshold: float, limit: int) -> None:
        if not 0.5 < threshold < 1.0:
            raise ValueError("threshold must be in (0.5, 1)")
        self.threshold = threshold
        self.limit = limit
        self._table: list[int] = []

    def min_top(self, b: int) -> int:
        table = self._table
        if b < len(table):
            return table[b]
        if b > self.limit:
            return self.limit + 1
        while len(table) <= b:
            second = len(table)
            a = max(second + 1, table[-1] if table else 1)
            while a <= self.limit and beta_confidence(a, second) < self.threshold:
                a += 1
            table.append(a)
        return table[b]

    def table(self, up_to: int) -> list[int]:
        """The ``min_top`` table filled for ``b <= up_to // 2`` (enough for ``up_to`` samples); read-only."""
        self.min_top(min(up_to // 2, self.limit))
        return self._table

    def solved(self, a: int, b: int) -> bool:
        """``beta_confidence(a, b) >= threshold`` (a table lookup while ``a <= limit``)."""
        if a > self.limit:
            return beta_confidence(a, b) >= self.threshold
        return a >= self.min_top(b)


class VoteStats:
    """Counts of one query's samples, updated incrementally by :meth:`update`.

    ``top``/``second``: the two largest vote counts (``top_answer`` holds the leader; ties keep the
    earlier leader); ``nulls``: samples without an answer; ``slogc = sum_c c ln c`` over the vote
    counts (the vote entropy of the ``entropy`` exploration rule); ``n_scored``,
    ``score_sum``, ``max_score``: verifier scores seen; ``tokens``: tokens spent. ``mark``/``mark_n``
    are a policy's memo (e.g. "solved" as of ``mark_n`` samples).
    """

    __slots__ = (
        "counts", "mark", "mark_n", "max_score", "n", "n_scored", "nulls", "ref", "score_sum", "second",
        "slogc", "tokens", "top", "top_answer",
    )

    def __init__(self, ref: list[Sample]) -> None:
        self.ref = ref
        self.n = 0
        self.nulls = 0
        self.counts: dict[str, int] = {}
        self.top_answer: str | None = None
        self.top = 0
        self.second = 0
        self.n_scored = 0
        self.score_sum = 0.0
        self.max_score = -math.inf
        self.tokens = 0
        self.mark = False
        self.mark_n = -1
        self.slogc = 0.0

    @property
    def votes(self) -> int:
        return self.n - self.nulls

    def add(self, s: Sample) -> None:
        """Count one more sample: **the** vote-counting rule of every policy built on these stats.

        Its tokens and verifier score are tallied; an answer adds one vote to its count and
        ``c ln c - (c - 1) ln (c - 1)`` to ``slogc``; the leader and runner-up follow the counts (a tie
        keeps the earlier leader); a sample without an answer is a null."""
        self.n += 1
        self.tokens += s.tokens
        score = s.score
        if score is not None:
            self.n_scored += 1
            self.score_sum += score
            if score > self.max_score:
                self.max_score = score
        ans = s.answer
        if ans is None:
            self.nulls += 1
            return
        counts = self.counts
        c = counts[ans] = counts.get(ans, 0) + 1
        self.slogc += XLOGX_STEPS[c] if c < _N_STEPS else xlogx_step(c)
        if ans == self.top_answer:
            self.top = c
        elif c > self.top:
            self.second, self.top, self.top_answer = self.top, c, ans
        elif c > self.second:
            self.second = c

    def update(self, samples: Sequence[Sample]) -> None:
        """Fold ``samples[self.n:]`` into the counts, one :meth:`add` each."""
        add = self.add
        for s in samples[self.n :]:
            add(s)


class StatsCache:
    """Per-query :class:`VoteStats` of one run, keyed by query id.

    A state whose ``samples`` list is a different object than last time, or shorter, is recounted
    from scratch; otherwise only the new samples are folded in (samples are append-only between
    rounds, as the engine keeps them). ``by_id`` is public so a policy's hot loop can inline
    :meth:`get`'s fast path.
    """

    __slots__ = ("by_id",)

    def __init__(self) -> None:
        self.by_id: dict[str, VoteStats] = {}

    def __len__(self) -> int:
        return len(self.by_id)

    def get(self, state: QueryState) -> VoteStats:
        """The query's stats, brought up to date with its samples (one :meth:`VoteStats.add` per new
        sample; a round of one new sample per query, the common case, costs one call)."""
        samples = state.samples
        s = self.by_id.get(state.id)
        n = len(samples)
        if s is None or s.ref is not samples or s.n > n:
            s = self.by_id[state.id] = VoteStats(samples)
        if s.n + 1 == n:
            s.add(samples[-1])
        elif s.n != n:
            s.update(samples)
        return s

    def total_samples(self) -> int:
        return sum(s.n for s in self.by_id.values())

    def mean_tokens(self, default: float) -> float:
        """Mean tokens per sample seen so far (``default`` before any token was counted)."""
        tokens = sum(s.tokens for s in self.by_id.values())
        return tokens / self.total_samples() if tokens > 0 else default
