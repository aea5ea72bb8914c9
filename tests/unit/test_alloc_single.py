"""Exact cases of the single-request policies: fixed, adaptive_consistency, esc."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

import pytest

from allocators import (
    AdaptiveConsistency,
    AdaptiveConsistencyParams,
    Allocator,
    Budget,
    Esc,
    EscParams,
    Fixed,
    FixedParams,
    QueryState,
    Sample,
    simulate,
)


def scripted(answers: dict[str, Sequence[str | None]], tokens: int = 0):  # type: ignore[no-untyped-def]
    """A draw function handing out each query's scripted answers in order."""
    streams: dict[str, Iterator[str | None]] = {q: iter(a) for q, a in answers.items()}

    def draw(state: QueryState, k: int) -> list[Sample]:
        return [Sample(answer=next(streams[state.id]), tokens=tokens) for _ in range(k)]

    return draw


def run_one(allocator: Allocator, answers: Sequence[str | None], cap: int = 100) -> tuple[int, list[int]]:
    state = QueryState(id="q", cap=cap)
    trace = simulate(allocator, [state], Budget(), scripted({"q": answers}))
    return state.spent, [p["q"] for p in trace.plans]


def ac(**params: object) -> AdaptiveConsistency:
    return AdaptiveConsistency(AdaptiveConsistencyParams.model_validate(params), random.Random(0))


def test_fixed_draws_n_in_one_round() -> None:
    alloc = Fixed(FixedParams(n=8), random.Random(0))
    assert run_one(alloc, ["a"] * 20) == (8, [8])


def test_fixed_chunks_by_per_round_and_respects_the_cap() -> None:
    alloc = Fixed(FixedParams(n=8, per_round=3), random.Random(0))
    assert run_one(alloc, ["a"] * 20) == (8, [3, 3, 2])
    assert run_one(alloc, ["a"] * 20, cap=5) == (5, [3, 2])


def test_fixed_continues_from_samples_already_drawn() -> None:
    alloc = Fixed(FixedParams(n=4), random.Random(0))
    state = QueryState(id="q", cap=10, samples=[Sample("a")] * 3)
    assert alloc.plan([state], Budget()) == {"q": 1}
    state.samples.append(Sample("a"))
    assert alloc.plan([state], Budget()) == {}


def test_ac_stops_after_three_identical_votes_at_threshold_090() -> None:
    # P = I_{1/2}(1, a + 1) = 1 - 2^-(a+1): a = 2 -> 7/8 < 0.9, a = 3 -> 15/16 >= 0.9
    assert run_one(ac(threshold=0.9, lookahead=False), ["x"] * 50) == (3, [1, 1, 1])
    assert run_one(ac(threshold=0.9, min_samples=1, per_round=2, lookahead=False), ["x"] * 50) == (4, [2, 2])
    # lookahead draws the three the rule needs at once
    assert run_one(ac(threshold=0.9), ["x"] * 50) == (3, [3])


def test_ac_stops_after_four_identical_votes_at_the_default_threshold() -> None:
    # 1 - 2^-4 = 0.9375 < 0.95 <= 1 - 2^-5 = 0.96875
    assert run_one(ac(), ["x"] * 50)[0] == 4


def test_ac_with_a_dissenting_vote_needs_five_leader_votes() -> None:
    # against b = 1 at threshold 0.9: a = 4 -> 57/64 = 0.89 < 0.9, a = 5 -> 120/128 = 0.9375
    answers = ["x", "y", "x", "x", "x", "x", "x", "x"]
    assert run_one(ac(threshold=0.9, lookahead=False), answers) == (6, [1] * 6)
    # lookahead: 3 (need at b = 0), then 5 - 2 = 3 more
    assert run_one(ac(threshold=0.9), answers) == (6, [3, 3])


def test_ac_unparseable_samples_do_not_vote() -> None:
    assert run_one(ac(threshold=0.9, min_samples=1, lookahead=False), [None, "x", None, "x", "x"])[0] == 5


def test_ac_caps_at_max_samples_when_votes_never_agree() -> None:
    answers = [str(i) for i in range(100)]
    assert run_one(ac(max_samples=7), answers)[0] == 7
    assert run_one(ac(max_samples=7), answers, cap=5)[0] == 5


def test_ac_min_samples_delays_a_low_threshold() -> None:
    # threshold 0.7: one vote (0.75) already suffices, min_samples holds it back
    assert run_one(ac(threshold=0.7, min_samples=1, lookahead=False), ["x"] * 9)[0] == 1
    assert run_one(ac(threshold=0.7, min_samples=3, lookahead=False), ["x"] * 9)[0] == 3
    assert run_one(ac(threshold=0.7, min_samples=3), ["x"] * 9) == (3, [3])


def test_ac_lookahead_spends_exactly_what_one_at_a_time_spends() -> None:
    rng = random.Random(7)
    for _ in range(200):
        answers = [rng.choice(["a", "a", "b", "c", None]) for _ in range(40)]
        threshold = rng.choice([0.8, 0.9, 0.95])
        one = run_one(ac(threshold=threshold, lookahead=False, max_samples=30), answers)[0]
        ahead = run_one(ac(threshold=threshold, lookahead=True, max_samples=30), answers)[0]
        assert one == ahead


def test_ac_params_validation() -> None:
    with pytest.raises(ValueError, match="min_samples"):
        AdaptiveConsistencyParams(min_samples=10, max_samples=5)


def esc(**params: object) -> Esc:
    return Esc(EscParams.model_validate(params), random.Random(0))


def test_esc_stops_after_a_unanimous_first_window() -> None:
    assert run_one(esc(), ["x"] * 50) == (5, [5])


def test_esc_continues_until_a_unanimous_window() -> None:
    answers = ["x", "x", "y", "x", "x"] + ["x", "x", "x", "x", "x"] + ["z"] * 10
    assert run_one(esc(), answers) == (10, [5, 5])


def test_esc_null_answers_never_make_a_window_unanimous() -> None:
    assert run_one(esc(window=2, max_samples=6, give_up_after=0), [None] * 10) == (6, [2, 2, 2])


def test_adaptive_policies_give_up_on_queries_without_answers() -> None:
    assert run_one(esc(window=2, max_samples=40), [None] * 50) == (4, [2, 2])  # 3 drawn, none voted: stop
    assert run_one(esc(window=2, max_samples=40), [None, None, "x", "x"] + ["x"] * 10) == (4, [2, 2])


def test_esc_caps_at_max_samples_mid_window() -> None:
    answers = [str(i) for i in range(100)]
    assert run_one(esc(window=5, max_samples=12, no_agreement_after=0), answers) == (12, [5, 5, 2])


def test_esc_completes_a_window_cut_by_the_budget() -> None:
    alloc = esc(window=4)
    state = QueryState(id="q", cap=40)
    assert alloc.plan([state], Budget(samples=3)) == {"q": 3}
    state.samples.extend([Sample("x")] * 3)
    assert alloc.plan([state], Budget()) == {"q": 1}
    state.samples.append(Sample("x"))
    assert alloc.plan([state], Budget()) == {}


def test_single_policies_share_a_budget_level_by_level_in_input_order() -> None:
    alloc = Fixed(FixedParams(n=4), random.Random(0))
    states = [QueryState(id=f"q{i}", cap=10) for i in range(3)]
    assert alloc.plan(states, Budget(samples=7)) == {"q0": 3, "q1": 2, "q2": 2}
    assert alloc.plan(states, Budget(samples=2)) == {"q0": 1, "q1": 1}


def test_token_budget_limits_samples_by_the_estimate() -> None:
    alloc = Fixed(FixedParams(n=8, tokens_per_sample=300), random.Random(0))
    state = QueryState(id="q", cap=10)
    assert alloc.plan([state], Budget(tokens=1000)) == {"q": 3}
    state.samples.extend([Sample("x", tokens=100)] * 2)  # now 100 tokens per sample on average
    assert alloc.plan([state], Budget(tokens=450)) == {"q": 4}
    assert alloc.plan([state], Budget(tokens=50)) == {}


def test_single_policies_work_on_many_queries_at_once() -> None:
    alloc = ac(threshold=0.9, lookahead=False)
    states = [QueryState(id="easy", cap=50), QueryState(id="split", cap=50)]
    draw = scripted({"easy": ["x"] * 50, "split": ["x", "y"] * 25})
    simulate(alloc, states, Budget(), draw)
    assert states[0].spent == 3
    assert states[1].spent == 40


def stopped(allocator: Allocator, answers: Sequence[str | None], cap: int = 100) -> tuple[int, str]:
    """Samples drawn and the allocator's stop reason once it planned nothing more."""
    state = QueryState(id="q", cap=cap)
    simulate(allocator, [state], Budget(), scripted({"q": answers}))
    return state.spent, allocator.stop_reason(state)


def test_answers_that_never_agree_are_given_up_and_say_so() -> None:
    """A prompt that is no question ("hello") gets a different number from every sample: the policy
    gives up after ``no_agreement_after`` samples instead of running to its cap (40)."""
    distinct = [str(i) for i in range(100)]
    n, why = stopped(ac(), distinct)
    assert 8 <= n < 12 and why == "no_agreement"  # checked after each round (a round may pass 8)
    assert stopped(ac(per_round=1, lookahead=False), distinct) == (8, "no_agreement")
    assert stopped(ac(no_agreement_after=0), distinct) == (40, "cap")
    assert stopped(esc(), distinct)[1] == "no_agreement"
    assert stopped(ac(per_round=1, lookahead=False), [None] * 10) == (3, "no_answer")
    assert stopped(ac(), ["x"] * 10)[1] == "policy"
    assert stopped(ac(max_samples=6, no_agreement_after=0), ["x", "y"] * 5) == (6, "cap")
    assert stopped(Fixed(FixedParams(n=8), random.Random(0)), distinct) == (8, "policy")
