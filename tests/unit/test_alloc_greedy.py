"""Exact cases of ``greedy`` and its value indices (:mod:`allocators.value`)."""

from __future__ import annotations

import random

import pytest

from allocators import Budget, Greedy, GreedyParams, QueryState, Sample, create, simulate
from allocators.value import HazardModel, VoteValue, vote_gain


def greedy(**params: object) -> Greedy:
    return Greedy(GreedyParams.model_validate(params), random.Random(0))


def votes(*answers: str | None, score: float | None = None) -> list[Sample]:
    return [Sample(answer=a, score=score) for a in answers]


# --- the KG(*) vote value -------------------------------------------------------------------------


def test_vote_gain_exact_small_cases() -> None:
    # (1, 0): one vote cannot flip the leader, so the one-step knowledge gradient is zero ...
    assert vote_gain(1, 0, 1) == pytest.approx(0.0, abs=1e-12)
    # ... two votes can: J ~ BB(2, 2, 1) = (1/6, 1/3, 1/2) over (1,2), (2,1), (3,0):
    # E q = 1/2 * 15/16 + 1/2 * 11/16 = 13/16, q(1, 0) = 3/4
    assert vote_gain(1, 0, 2) == pytest.approx(13 / 16 - 3 / 4)
    # (1, 1): one vote breaks the tie: q(2, 1) = 11/16, q(1, 1) = 1/2
    assert vote_gain(1, 1, 1) == pytest.approx(11 / 16 - 1 / 2)
    assert all(vote_gain(a, b, m) >= 0 for a in range(6) for b in range(a + 1) for m in range(1, 5))


def test_vote_value_is_the_best_gain_per_sample_within_room_and_lookahead() -> None:
    value = VoteValue(horizon=4)
    assert value(1, 0, room=1) == pytest.approx(0.0, abs=1e-12)  # no room for the two votes that matter
    assert value(1, 0, room=9) == pytest.approx(max(vote_gain(1, 0, m) / m for m in range(1, 5)))
    # close contests are worth more than settled ones
    assert value(2, 2, 8) > value(3, 1, 8) > value(4, 0, 8)
    assert (1, 0, 1) in value.memo


# --- the online hazard model ---------------------------------------------------------------------


def test_hazard_model_shrinks_level_by_level() -> None:
    model = HazardModel(kappa=2.0)
    for solved in (True, True, False, False):  # 2 of 4 first draws solved
        model.observe(0, 0, solved)
    model.observe(1, 1, False)
    model.observe(1, 1, True)
    model.observe(1, 0, False)
    t = model.table(2)
    h0 = (2 + 1) / (4 + 2)
    h1 = (1 + 2 * h0) / (3 + 2)
    assert t[0] == [pytest.approx(h0)]
    assert t[1][0] == pytest.approx((0 + 2 * h1) / (1 + 2))
    assert t[1][1] == pytest.approx((1 + 2 * h1) / (2 + 2))
    h2 = (0 + 2 * h1) / (0 + 2)  # unseen level: its parent
    assert t[2] == [pytest.approx(h2)] * 3


# --- plans ---------------------------------------------------------------------------------------


def test_first_round_tries_everyone_then_settled_queries_leave() -> None:
    g = greedy(first=2)
    states = [QueryState(id=f"q{i}", cap=10) for i in range(3)]
    assert g.plan(states, Budget(samples=100)) == {"q0": 2, "q1": 2, "q2": 2}
    states[0].samples = votes("x", "x", "x", "x")  # beta_confidence(4, 0) = 31/32 >= 0.95: settled
    states[1].samples = votes("x", "y")
    states[2].samples = votes("x", "x")
    plan = g.plan(states, Budget(samples=100))
    assert "q0" not in plan
    assert list(plan) == ["q1"]  # fraction 0.5 of the two active: the tie is ranked first


def test_budget_ranks_by_value_and_final_partial_round_goes_to_the_top() -> None:
    g = greedy(fraction=1.0, k=2)
    states = [
        QueryState(id="easy", cap=10, samples=votes("x", "x", "x")),
        QueryState(id="tie", cap=10, samples=votes("x", "y")),
        QueryState(id="spread", cap=10, samples=votes("x", "y", "z", "w", None, None)),
    ]
    # index rho * G: tie 3/4 * G(1, 1), spread 3/8 * G(1, 1) (half the votes land in its top two), easy ~0.001
    assert g.plan(states, Budget(samples=2)) == {"tie": 1, "spread": 1}
    assert g.plan(states, Budget(samples=4)) == {"tie": 2, "spread": 1, "easy": 1}  # level by level, in rank order


def test_no_budget_gives_every_active_query_k_and_respects_caps() -> None:
    g = greedy(k=3, max_samples=4)
    states = [
        QueryState(id="a", cap=10, samples=votes("x", "y")),
        QueryState(id="b", cap=3, samples=votes("x", "y")),
        QueryState(id="full", cap=2, samples=votes("x", "y")),
    ]
    assert g.plan(states, Budget()) == {"a": 2, "b": 1}  # a: max_samples 4; b: cap 3


def test_with_scores_solved_queries_leave_and_cheap_failures_go_first() -> None:
    g = greedy(fraction=0.5)
    states = [QueryState(id=f"q{i}", cap=8) for i in range(4)]
    assert g.plan(states, Budget(samples=40)) == {f"q{i}": 1 for i in range(4)}
    states[0].samples = votes("right", score=1.0)
    states[1].samples = votes("w", score=0.0)
    states[2].samples = votes("w", score=0.0)
    states[3].samples = votes("w", score=0.0)
    plan = g.plan(states, Budget(samples=40))
    assert "q0" not in plan and len(plan) == 2  # ceil(0.5 * 3) of the unsolved
    # one solve in four first draws: h(0) = 2/6, h(0, 0) = (1 + 4 * h(0)) / (4 + 4)
    assert g._hazard.table(1)[0] == [pytest.approx((1 + 4 * 2 / 6) / 8)]
    states[1].samples += votes("w", score=0.0)
    states[2].samples += votes("v", score=0.0)
    g.plan(states, Budget(samples=40))
    assert g._hazard.t_fc == {(0, 0): 4, (1, 1): 2}


def test_token_budget_and_zero_budget() -> None:
    g = greedy()
    states = [QueryState(id=f"q{i}", cap=5) for i in range(4)]
    assert g.plan(states, Budget(samples=0)) == {}
    plan = g.plan(states, Budget(tokens=1024))  # 512 tokens per sample assumed: 2 samples
    assert sum(plan.values()) == 2


def test_runs_are_deterministic_and_stay_in_budget() -> None:
    def once() -> list[dict[str, int]]:
        rng = random.Random(7)
        g = create("greedy", {}, random.Random(7))
        states = [QueryState(id=f"q{i}", cap=16) for i in range(30)]
        p = {st.id: rng.random() for st in states}

        def draw(st: QueryState, k: int) -> list[Sample]:
            return [Sample(answer="ok" if rng.random() < p[st.id] else rng.choice("abc")) for _ in range(k)]

        trace = simulate(g, states, Budget(samples=120), draw)
        assert trace.samples <= 120
        return trace.plans

    assert once() == once()
