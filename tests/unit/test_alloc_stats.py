"""Beta rule, incremental vote counts and budget arithmetic."""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocators import Budget, QueryState, Sample, check_plan, proportional_split, sample_limit, water_fill
from allocators.budgeting import mean_tokens
from allocators.errors import PlanError
from allocators.exploration import entropy_scores
from allocators.stats import BetaRule, StatsCache, VoteStats, beta_confidence, xlogx_step


def test_beta_confidence_exact_values() -> None:
    assert beta_confidence(0, 0) == 0.5
    assert beta_confidence(1, 0) == 3 / 4
    assert beta_confidence(2, 0) == 7 / 8
    assert beta_confidence(3, 0) == 15 / 16
    assert beta_confidence(4, 0) == 31 / 32
    assert beta_confidence(2, 1) == 11 / 16
    assert beta_confidence(4, 1) == 57 / 64
    assert beta_confidence(5, 1) == 120 / 128


def _beta_numeric(a: int, b: int) -> float:
    """P(p > 1/2) for p ~ Beta(a + 1, b + 1) by integrating the density (independent check)."""
    x = np.linspace(0.5, 1.0, 200_001)[:-1]
    log_norm = math.lgamma(a + b + 2) - math.lgamma(a + 1) - math.lgamma(b + 1)
    pdf = np.exp(log_norm + a * np.log(x) + b * np.log1p(-x))
    pdf = np.append(pdf, 0.0 if b > 0 else math.exp(log_norm))
    return float(np.trapezoid(pdf, np.linspace(0.5, 1.0, 200_001)))


@pytest.mark.parametrize(("a", "b"), [(1, 0), (3, 0), (3, 2), (7, 3), (10, 9), (20, 4)])
def test_beta_confidence_matches_the_beta_posterior(a: int, b: int) -> None:
    assert beta_confidence(a, b) == pytest.approx(_beta_numeric(a, b), abs=1e-6)


@settings(database=None)
@given(st.integers(0, 60), st.integers(0, 60))
def test_beta_confidence_symmetry_and_monotonicity(a: int, b: int) -> None:
    assert beta_confidence(a, b) + beta_confidence(b, a) == pytest.approx(1.0, abs=1e-12)
    def exact(a: int, b: int) -> Fraction:
        return Fraction(sum(math.comb(a + b + 1, j) for j in range(a + 1)), 2 ** (a + b + 1))

    assert exact(a + 1, b) > exact(a, b) > exact(a, b + 1)
    assert beta_confidence(a + 1, b) >= beta_confidence(a, b) >= beta_confidence(a, b + 1)
    assert beta_confidence(a, b) == float(exact(a, b))


@pytest.mark.parametrize(("threshold", "expected"), [(0.9, [3, 5]), (0.95, [4, 6]), (0.7, [1, 3])])
def test_beta_rule_min_top(threshold: float, expected: list[int]) -> None:
    rule = BetaRule(threshold, limit=40)
    assert [rule.min_top(0), rule.min_top(1)] == expected


@settings(database=None)
@given(st.floats(0.51, 0.999), st.integers(1, 60), st.integers(0, 40))
def test_beta_rule_min_top_is_the_smallest_solving_count(threshold: float, limit: int, b: int) -> None:
    rule = BetaRule(threshold, limit)
    brute = next((a for a in range(limit + 1) if beta_confidence(a, b) >= threshold), limit + 1)
    assert rule.min_top(b) == brute
    for a in range(limit + 3):
        assert rule.solved(a, b) == (beta_confidence(a, b) >= threshold)


def test_beta_rule_rejects_bad_thresholds() -> None:
    with pytest.raises(ValueError):
        BetaRule(0.5, 10)
    with pytest.raises(ValueError):
        BetaRule(1.0, 10)


answers = st.one_of(st.none(), st.sampled_from("abcde"))
samples_st = st.lists(
    st.builds(Sample, answer=answers, score=st.one_of(st.none(), st.floats(0, 1)), tokens=st.integers(0, 9)),
    max_size=40,
)


def entropy_of(stats: VoteStats) -> float:
    """The normalised vote entropy the ``entropy`` exploration rule computes (never hopeless here)."""
    return entropy_scores([stats], hopeless_after=10**9, hopeless_share=0.0)[0]


@settings(database=None)
@given(samples_st, st.lists(st.integers(0, 40), max_size=5))
def test_vote_stats_incremental_equals_recount(samples: list[Sample], cuts: list[int]) -> None:
    grown: list[Sample] = []
    stats = VoteStats(grown)
    for cut in [*sorted(cuts), len(samples)]:
        grown.extend(samples[len(grown) : max(len(grown), cut)])
        stats.update(grown)
    state = QueryState(id="q", cap=100, samples=list(samples))
    votes = Counter(s.answer for s in samples if s.answer is not None)
    assert (stats.top, stats.second) == state.top_two()
    assert stats.counts == dict(votes)
    assert stats.n == len(samples)
    assert stats.nulls == sum(s.answer is None for s in samples)
    assert stats.tokens == state.tokens_spent
    scores = [s.score for s in samples if s.score is not None]
    assert stats.n_scored == len(scores)
    assert stats.max_score == (max(scores) if scores else -math.inf)
    assert stats.slogc == pytest.approx(sum(c * math.log(c) for c in votes.values()))
    total = sum(votes.values())
    if total > 1:
        h = -sum(c / total * math.log(c / total) for c in votes.values())
        assert entropy_of(stats) == pytest.approx(h / math.log(total), abs=1e-9)
    elif stats.n:
        assert entropy_of(stats) == 0.0
    if stats.top:
        assert votes[stats.top_answer] == stats.top


def test_xlogx_step_beyond_table() -> None:
    c = 5000
    assert xlogx_step(c) == pytest.approx(c * math.log(c) - (c - 1) * math.log(c - 1))
    assert xlogx_step(1) == 0.0


def test_stats_cache_recounts_a_replaced_or_shrunk_list() -> None:
    cache = StatsCache()
    state = QueryState(id="q", cap=10, samples=[Sample("a"), Sample("a")])
    assert cache.get(state).top == 2
    state.samples = [Sample("b")]
    s = cache.get(state)
    assert (s.top, s.top_answer, s.n) == (1, "b", 1)
    state.samples.append(Sample("b"))
    assert cache.get(state).top == 2
    assert cache.total_samples() == 2
    assert cache.mean_tokens(7.0) == 7.0
    assert len(cache) == 1


def test_sample_limit() -> None:
    assert sample_limit(Budget(), 10) is None
    assert sample_limit(Budget(samples=5), 10) == 5
    assert sample_limit(Budget(tokens=95), 10) == 9
    assert sample_limit(Budget(samples=5, tokens=95), 10) == 5
    assert sample_limit(Budget(samples=50, tokens=95), 10) == 9
    assert sample_limit(Budget(samples=-3), 10) == 0
    assert sample_limit(Budget(tokens=-1), 10) == 0


def test_mean_tokens() -> None:
    states = [QueryState("a", 5, samples=[Sample("x", tokens=10), Sample("y", tokens=30)]), QueryState("b", 5)]
    assert mean_tokens(states, 99) == 20
    assert mean_tokens([QueryState("c", 5, samples=[Sample("x")])], 99) == 99


def test_water_fill_levels_then_rank_order() -> None:
    assert water_fill(["a", "b", "c"], [2, 2, 2], 5) == {"a": 2, "b": 2, "c": 1}
    assert water_fill(["a", "b", "c"], [2, 2, 2], 2) == {"a": 1, "b": 1}
    assert water_fill(["a", "b", "c"], [1, 5, 2], 6) == {"a": 1, "b": 3, "c": 2}
    assert water_fill(["a", "b"], [3, 0], None) == {"a": 3}
    assert water_fill(["a", "b"], [3, 1], 0) == {}
    assert water_fill(["a", "b"], [3, 1], 10) == {"a": 3, "b": 1}


@settings(database=None)
@given(st.lists(st.integers(0, 20), min_size=1, max_size=30), st.integers(0, 300))
def test_water_fill_properties(wants: list[int], limit: int) -> None:
    ids = [f"q{i}" for i in range(len(wants))]
    plan = water_fill(ids, wants, limit)
    got = [plan.get(i, 0) for i in ids]
    assert sum(got) == min(limit, sum(wants))
    assert all(0 <= g <= w for g, w in zip(got, wants, strict=True))
    assert all(v > 0 for v in plan.values())
    unmet = [i for i, (g, w) in enumerate(zip(got, wants, strict=True)) if g < w]
    for i in unmet:  # nobody short of its want is below anyone else's level by more than one
        assert all(got[j] <= got[i] + 1 for j in range(len(got)))
        assert all(got[j] >= got[i] for j in unmet if j < i)  # earlier ranks are served first


def test_proportional_split_exact() -> None:
    assert proportional_split([1, 1, 2], [10, 10, 10], 8) == [2, 2, 4]
    assert proportional_split([1, 1, 2], [10, 10, 1], 8) == [4, 3, 1]
    assert proportional_split([1, 0, 1], [5, 5, 5], 100) == [5, 0, 5]
    assert proportional_split([0, 0], [5, 5], 3) == [0, 0]
    assert proportional_split([1, 1, 1], [5, 5, 5], 2) == [1, 1, 0]


@settings(database=None)
@given(
    st.lists(st.tuples(st.floats(0, 1), st.integers(-2, 30)), min_size=1, max_size=25),
    st.integers(0, 400),
)
def test_proportional_split_properties(rows: list[tuple[float, int]], total: int) -> None:
    weights = [w for w, _ in rows]
    caps = [c for _, c in rows]
    x = proportional_split(weights, caps, total)
    eligible_cap = sum(c for w, c in rows if w > 0 and c > 0)
    assert sum(x) == min(total, eligible_cap)
    for (w, c), xi in zip(rows, x, strict=True):
        assert 0 <= xi <= max(c, 0)
        if w <= 0:
            assert xi == 0


@settings(max_examples=50, database=None)
@given(st.lists(st.floats(0.01, 1), min_size=2, max_size=10), st.integers(1, 200))
def test_proportional_split_is_proportional_when_uncapped(weights: list[float], total: int) -> None:
    x = proportional_split(weights, [10_000] * len(weights), total)
    share = sum(weights)
    for w, xi in zip(weights, x, strict=True):
        assert abs(xi - total * w / share) < 1 + 1e-9 * total


def test_check_plan() -> None:
    states = [QueryState("a", 3), QueryState("b", 1, samples=[Sample("x")])]
    check_plan({"a": 3}, states, Budget(samples=3))
    for bad, budget in [
        ({"z": 1}, Budget()),
        ({"a": 0}, Budget()),
        ({"a": 4}, Budget()),
        ({"b": 1}, Budget()),
        ({"a": 2}, Budget(samples=1)),
        ({"a": True}, Budget()),
    ]:
        with pytest.raises(PlanError):
            check_plan(bad, states, budget)  # type: ignore[arg-type]
