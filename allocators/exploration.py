"""Exploration rules: which active queries of a batch get samples this round.

Each rule scores the active queries from their :class:`~allocators.stats.VoteStats` (higher: sampled
first) and :func:`rank` orders them (a stable sort: ties keep input order). Every rule puts queries
that have no sample yet first (score ``+inf``, or the maximum for ``all``), so every query is tried
once before any query is tried twice. Notation: ``n`` samples of the query, ``a``/``b`` its top-two
vote counts, ``N = n - nulls`` its votes, ``t`` samples drawn in the whole run.

* ``all``:     ``-n`` (everyone is selected; in a partial round the least-sampled go first).
* ``ucb``:     ``p_hat + c * sqrt(ln max(t, 2) / n)``, an upper confidence bound on the chance that one
  more sample solves the query, with ``p_hat`` the mean verifier score when samples are scored and the
  smoothed leader share ``(a + 1) / (n + 2)`` otherwise.
* ``gap``:     ``-(distance to the solved threshold)``: ``gamma - max_score`` with scores, otherwise the
  fewest further samples before the Beta rule could fire, ``max(min_samples - n, min_top(b) - a)``.
* ``entropy``: the normalised vote entropy ``H / ln N`` (``H = ln N - sum_c c ln c / N``), higher first:
  spread votes mark hard-but-solvable queries. A query is *hopeless* after ``hopeless_after`` samples
  when its leader holds at most ``hopeless_share`` of them (all unparseable, or spread over many
  answers); hopeless queries score ``-1`` and go last.

Rules other than ``all`` select the top ``max(ceil(fraction * active), unexplored)`` queries each
round (:func:`selection_size`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np

from .stats import BetaRule, VoteStats

ExplorationRule = Literal["all", "ucb", "gap", "entropy"]
EXPLORATION_RULES: tuple[ExplorationRule, ...] = ("all", "ucb", "gap", "entropy")


def all_scores(stats: Sequence[VoteStats]) -> list[float]:
    """``-n``: fewest samples first."""
    return [float(-s.n) for s in stats]


def ucb_scores(stats: Sequence[VoteStats], total: int, c: float) -> list[float]:
    """``p_hat + c * sqrt(ln max(t, 2) / n)``; ``+inf`` for ``n = 0``."""
    bonus = c * math.sqrt(math.log(max(total, 2)))
    sqrt, inf = math.sqrt, math.inf
    out: list[float] = []
    for s in stats:
        n = s.n
        if n == 0:
            out.append(inf)
        elif s.n_scored:
            out.append(s.score_sum / s.n_scored + bonus / sqrt(n))
        else:
            out.append((s.top + 1) / (n + 2) + bonus / sqrt(n))
    return out


def gap_scores(stats: Sequence[VoteStats], gamma: float, rule: BetaRule, min_samples: int) -> list[float]:
    """Minus the distance to solved: ``gamma - max_score`` (scored) or the samples the Beta rule needs."""
    out: list[float] = []
    min_top = rule.min_top
    table = rule.table(min(rule.limit, 64))
    size = len(table)
    inf = math.inf
    for s in stats:
        n = s.n
        if n == 0:
            out.append(inf)
        elif s.n_scored:
            out.append(s.max_score - gamma)
        else:
            b = s.second
            need = (table[b] if b < size else min_top(b)) - s.top
            out.append(float(-(need if need > min_samples - n else min_samples - n)))
    return out


def entropy_scores(stats: Sequence[VoteStats], hopeless_after: int, hopeless_share: float) -> list[float]:
    """Normalised vote entropy in [0, 1], ``-1`` for hopeless queries, ``+inf`` for ``n = 0``."""
    out: list[float] = []
    log, inf = math.log, math.inf
    for s in stats:
        n = s.n
        if n == 0:
            out.append(inf)
        elif n >= hopeless_after and s.top <= hopeless_share * n:
            out.append(-1.0)
        else:
            votes = n - s.nulls
            if votes <= 1:
                out.append(0.0)
            else:
                log_n = log(votes)
                out.append(max(0.0, (log_n - s.slogc / votes) / log_n))
    return out


def rank(scores: Sequence[float]) -> list[int]:
    """Indices by descending score, ties in input order (a stable sort in numpy)."""
    return np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable").tolist()


def selection_size(active: int, unexplored: int, fraction: float) -> int:
    """Queries a non-``all`` rule samples this round: ``min(active, max(unexplored, ceil(f * active)))``."""
    return min(active, max(unexplored, math.ceil(fraction * active)))
