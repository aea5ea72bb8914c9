"""Exact cases of ``calibrated_margin``: the margin rule with its margin learned from finished queries."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence

import pytest
from pydantic import ValidationError

from allocators import Budget, CalibratedMargin, CalibratedMarginParams, QueryState, Sample, simulate


def finished(*scores: float | None, answer: str | None = "1") -> QueryState:
    return QueryState(id="done", cap=16, samples=[Sample(answer, s) for s in scores])


def fed(params: CalibratedMarginParams, firsts: Sequence[float]) -> CalibratedMargin:
    alloc = CalibratedMargin(params, random.Random(0))
    alloc.learn([finished(s, 0.99) for s in firsts])  # only each query's first scored sample counts
    return alloc


def spent_on(alloc: CalibratedMargin, stream: Sequence[tuple[str, float]]) -> int:
    it = iter(stream)
    state = QueryState(id="q", cap=16)
    simulate(alloc, [state], Budget(), lambda _s, k: [Sample(*next(it)) for _ in range(k)])
    return state.spent


def test_until_min_history_the_fixed_margin_rules() -> None:
    alloc = fed(CalibratedMarginParams(margin=0.5, min_history=4), [0.01, 0.02, 0.03])
    assert alloc.margin_now() == 0.5
    # 0.2 per sample on one answer: leads 0.2, 0.4, 0.6 -> the fixed margin stops it at the third
    assert spent_on(alloc, [("7", 0.2)] * 16) == 3


def test_the_learned_margin_is_the_nearest_rank_quantile_of_first_scores() -> None:
    firsts = [0.9, 0.1, 0.5, 0.3, 0.7]  # sorted 0.1 0.3 0.5 0.7 0.9
    assert fed(CalibratedMarginParams(quantile=0.5, min_history=5), firsts).margin_now() == 0.5
    assert fed(CalibratedMarginParams(quantile=0.65, min_history=5), firsts).margin_now() == 0.5  # floor(0.65*4)=2
    assert fed(CalibratedMarginParams(quantile=0.8, min_history=5), firsts).margin_now() == 0.7
    assert fed(CalibratedMarginParams(quantile=0.1, min_history=5), firsts).margin_now() == 0.1


def test_a_model_whose_answers_are_unlikely_stops_on_its_own_scale() -> None:
    # long traces: first answers score ~0.01-0.05, so a fixed 0.5 would run every query to the cap
    params = CalibratedMarginParams(quantile=0.6, min_history=8)
    fixed = CalibratedMargin(params, random.Random(0))
    learned = fed(params, [0.01, 0.02, 0.02, 0.03, 0.03, 0.04, 0.05, 0.05])
    assert learned.margin_now() == 0.03
    stream = [("7", 0.04)] * 16
    assert spent_on(fixed, stream) == 13  # lead 0.04 per sample: 13 samples reach 0.52
    assert spent_on(learned, stream) == 1


def test_only_the_recent_history_counts_and_odd_samples_are_skipped() -> None:
    alloc = CalibratedMargin(CalibratedMarginParams(history=3, min_history=3, quantile=0.5), random.Random(0))
    alloc.learn([finished(0.9), finished(0.8), finished(0.7)])
    assert alloc.margin_now() == 0.8
    alloc.learn([finished(0.1), finished(0.2)])  # 0.9 and 0.8 fall out: 0.7 0.1 0.2
    assert alloc.margin_now() == 0.2
    # no scored answer (unscored, unanswered, or no samples at all): nothing is learned
    alloc.learn([finished(None, None), finished(0.99, answer=None), QueryState(id="empty", cap=4)])
    assert alloc.state_dict() == {"scores": [0.7, 0.1, 0.2]}
    # a first sample that carried no score but a later one did: the later one is the query's first score
    alloc.learn([QueryState(id="mixed", cap=4, samples=[Sample("1", None), Sample("1", 0.05)])])
    assert alloc.state_dict() == {"scores": [0.1, 0.2, 0.05]}


def test_a_margin_never_reaches_zero() -> None:
    alloc = fed(CalibratedMarginParams(quantile=0.5, min_history=2), [0.0, 0.0, 0.0])
    assert alloc.margin_now() == pytest.approx(1e-12)
    # a lone unscored vote leads by 1, but two answers with a zero score tie: no lead, no stop yet
    state = QueryState(id="q", cap=16, samples=[Sample("1", 0.0), Sample("2", 0.0)])
    assert alloc.want(state) == 1


def test_state_round_trips_through_json_and_bad_state_is_refused_whole() -> None:
    params = CalibratedMarginParams(quantile=0.5, min_history=2, history=4)
    a = fed(params, [0.25, 0.5, 0.125])
    b = CalibratedMargin(params, random.Random(9))
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert b.state_dict() == a.state_dict() and b.margin_now() == a.margin_now() == 0.25
    a.learn([finished(0.75)])
    b.learn([finished(0.75)])
    assert a.state_dict() == b.state_dict()
    before = b.state_dict()
    for bad in ({"scores": [0.1, math.nan]}, {"scores": [1.5]}, {"scores": ["0.1"]}, {"scores": [True]},
                {"scores": [0.1] * 5}, {"scores": 0.1}, {"scores": [], "extra": 1}, {}):
        with pytest.raises(ValueError, match="calibrated_margin state"):
            b.load_state_dict(bad)
        assert b.state_dict() == before


def test_params_are_bounded() -> None:
    for bad in ({"quantile": 0.0}, {"quantile": 1.0}, {"history": 0}, {"min_history": 300},
                {"history": 8, "min_history": 9}, {"margin": 0.0}, {"typo": 1}):
        with pytest.raises(ValidationError):
            CalibratedMarginParams.model_validate(bad)
    p = CalibratedMarginParams()
    assert (p.quantile, p.history, p.min_history, p.max_samples, p.first, p.step) == (0.65, 256, 16, 16, 1, 1)
