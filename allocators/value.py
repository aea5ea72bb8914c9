"""Value-of-information indices for the ``greedy`` policy.

* :class:`VoteValue` (no verifier): KG(*) on the majority-vote decision. With ``a`` / ``b`` the
  leader's and runner-up's votes, the leader's share of the two is ``p ~ Beta(a + 1, b + 1)`` and the
  chance that the current choice is the better answer is ``q(a, b) = max(c, 1 - c)`` with
  ``c = beta_confidence(a, b) = P(p > 1/2)``. ``m`` more votes split ``J`` / ``m - J`` with ``J``
  Beta-binomial ``BB(m, a + 1, b + 1)`` (the posterior predictive), so the expected gain in the
  chance of being right is ``g(m) = E[q(a + J, b + m - J)] - q(a, b)`` (``>= 0``: the chance is a
  martingale and ``q`` its maximum with its complement). The index is the best gain per sample over
  a lookahead ``1 <= m <= H`` (KG(*), Frazier & Powell): ``G(a, b, H) = max_m g(m) / m``. One-step
  knowledge gradient is zero whenever one vote cannot flip the leader; the lookahead sees the value
  of a few votes together. A vote of a sample lands in the top two at the smoothed rate
  ``rho = (a + b + 1) / (n + 2)`` (nulls and third answers do not move the decision), so the value of
  one more *sample* is ``rho * G``: queries whose answers are spread over many values, or are mostly
  unparseable, are worth less than two-way contests.
* :class:`HazardModel` (verifier): the chance that the next sample of an unsolved query is solved
  (score ``>= gamma``), estimated online from the batch itself (empirical Bayes). Every drawn
  sample is one observation of the state its query was in: ``(f, c)``, ``f`` failed samples so far
  and ``c`` the count of the most repeated failed answer (a systematic wrong answer makes ``c`` grow
  with ``f``; diverse wrong answers keep it low). Estimates shrink level by level::

      h(0)    = (S_0 + 1) / (T_0 + 2)
      h(f)    = (S_f + kappa * h(f - 1)) / (T_f + kappa)              f >= 1
      h(f, c) = (S_fc + kappa * h(f)) / (T_fc + kappa)

  (``S``: solved draws, ``T``: draws, in that state). Pass@1 across problems is U-shaped, so the
  population hazard falls with ``f`` (a Beta-mixture posterior mean ``alpha / (alpha + beta + f)``);
  the chain ``h(f) <- h(f - 1)`` shrinks a thinly observed level towards the level before it.
"""

from __future__ import annotations

import math
from functools import lru_cache

from .stats import beta_confidence


@lru_cache(maxsize=1 << 16)
def _right(a: int, b: int) -> float:
    """``q(a, b) = max(c, 1 - c)``, ``c = P(p > 1/2)`` for ``p ~ Beta(a + 1, b + 1)``."""
    c = beta_confidence(a, b) if a >= b else 1.0 - beta_confidence(b, a)
    return c if c >= 0.5 else 1.0 - c


def _betabinom(m: int, a: int, b: int) -> list[float]:
    """``P(J = j)`` for ``J ~ BB(m, a + 1, b + 1)``, ``j = 0..m``."""
    lg = math.lgamma
    base = lg(a + b + 2) - lg(a + 1) - lg(b + 1) - lg(a + b + m + 2) + lg(m + 1)
    return [math.exp(base + lg(j + a + 1) + lg(m - j + b + 1) - lg(j + 1) - lg(m - j + 1)) for j in range(m + 1)]


def vote_gain(a: int, b: int, m: int) -> float:
    """``g(m)``: expected gain in the chance the chosen answer is the better of the top two after ``m`` votes."""
    pmf = _betabinom(m, a, b)
    after = sum(w * _right(a + j, b + m - j) for j, w in enumerate(pmf))
    return max(0.0, after - _right(a, b))


class VoteValue:
    """``G(a, b, H) = max_{1 <= m <= H} g(m) / m``, memoised (``a >= b`` by convention)."""

    __slots__ = ("_memo", "horizon")

    def __init__(self, horizon: int) -> None:
        self.horizon = horizon
        self._memo: dict[tuple[int, int, int], float] = {}

    def __call__(self, a: int, b: int, room: int) -> float:
        h = room if room < self.horizon else self.horizon
        key = (a, b, h)
        v = self._memo.get(key)
        if v is None:
            v = self._memo[key] = max((vote_gain(a, b, m) / m for m in range(1, h + 1)), default=0.0)
        return v

    @property
    def memo(self) -> dict[tuple[int, int, int], float]:
        """The memo, for hot loops that inline the lookup."""
        return self._memo


class HazardModel:
    """Online tallies of solved / drawn per state ``(f, c)`` and the shrunk hazard estimates."""

    __slots__ = ("kappa", "s_f", "s_fc", "t_f", "t_fc")

    def __init__(self, kappa: float) -> None:
        self.kappa = kappa
        self.t_f: list[int] = []
        self.s_f: list[int] = []
        self.t_fc: dict[tuple[int, int], int] = {}
        self.s_fc: dict[tuple[int, int], int] = {}

    def observe(self, f: int, c: int, solved: bool) -> None:
        """One draw made in state ``(f, c)``; ``solved``: its score reached ``gamma``."""
        t_f, s_f = self.t_f, self.s_f
        while len(t_f) <= f:
            t_f.append(0)
            s_f.append(0)
        t_f[f] += 1
        key = (f, c)
        self.t_fc[key] = self.t_fc.get(key, 0) + 1
        if solved:
            s_f[f] += 1
            self.s_fc[key] = self.s_fc.get(key, 0) + 1

    def table(self, up_to: int) -> list[list[float]]:
        """``table[f][c] = h(f, c)`` for ``0 <= c <= f <= up_to``."""
        kappa = self.kappa
        t_f, s_f, t_fc, s_fc = self.t_f, self.s_f, self.t_fc, self.s_fc
        out: list[list[float]] = []
        prev = 0.5
        for f in range(up_to + 1):
            t = t_f[f] if f < len(t_f) else 0
            s = s_f[f] if f < len(s_f) else 0
            hf = (s + 1.0) / (t + 2.0) if f == 0 else (s + kappa * prev) / (t + kappa)
            prev = hf
            out.append([
                (s_fc.get((f, c), 0) + kappa * hf) / (t_fc.get((f, c), 0) + kappa) if (f, c) in t_fc else hf
                for c in range(f + 1)
            ])
        return out
