"""Property tests: any policy, params, states and budgets keep the allocator contract over a whole run.

Each example simulates a run (answers drawn from a seeded model of each query) and checks: every plan
keeps the contract (known ids, 1 <= k <= room, total <= samples left), planned samples never exceed
the token budget, no query passes its cap or its policy's max, the run ends, it replays identically
under the same seed, and with at least one sample per query every query gets one.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocators import (
    Budget,
    Elimination,
    Greedy,
    MarginParams,
    QueryState,
    Sample,
    Trace,
    create,
    simulate,
    weighted_lead,
)
from allocators.single import gave_up
from allocators.stats import BetaRule
from allocators.value import VoteValue

PARAMS: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "fixed": st.fixed_dictionaries({"n": st.integers(1, 12), "per_round": st.none() | st.integers(1, 5)}),
    "adaptive_consistency": st.fixed_dictionaries({
        "threshold": st.floats(0.6, 0.99),
        "min_samples": st.integers(1, 4),
        "max_samples": st.integers(4, 16),
        "per_round": st.integers(1, 3),
        "lookahead": st.booleans(),
    }),
    "esc": st.fixed_dictionaries({"window": st.integers(1, 5), "max_samples": st.integers(1, 16)}),
    "deepconf": st.fixed_dictionaries({
        "warmup": st.integers(1, 4),
        "max_samples": st.integers(4, 16),
        "consensus": st.floats(0.6, 1.0),
        "step": st.integers(1, 4),
    }),
    "margin": st.fixed_dictionaries({
        "margin": st.floats(0.05, 3),
        "max_samples": st.integers(4, 16),
        "first": st.integers(1, 4),
        "step": st.integers(1, 4),
    }),
    "calibrated_margin": st.fixed_dictionaries({
        "margin": st.floats(0.05, 3),
        "quantile": st.floats(0.05, 0.95),
        "min_history": st.integers(1, 4),
        "max_samples": st.integers(4, 16),
        "step": st.integers(1, 4),
    }),
    "elimination": st.fixed_dictionaries({
        "k": st.integers(1, 3),
        "gamma": st.floats(0, 1),
        "consistency_threshold": st.floats(0.6, 0.99),
        "min_samples": st.integers(1, 4),
        "max_samples": st.integers(4, 16),
        "exploration": st.sampled_from(["all", "ucb", "gap", "entropy"]),
        "fraction": st.floats(0.05, 1),
        "ucb_c": st.floats(0, 3),
        "hopeless_after": st.integers(1, 8),
        "hopeless_share": st.floats(0, 0.9),
    }),
    "greedy": st.fixed_dictionaries({
        "k": st.integers(1, 3),
        "first": st.integers(1, 3),
        "gamma": st.floats(0, 1),
        "consistency_threshold": st.floats(0.6, 0.99),
        "min_samples": st.integers(1, 4),
        "max_samples": st.integers(4, 16),
        "lookahead": st.integers(1, 10),
        "kappa": st.floats(0.1, 20),
        "fraction": st.floats(0.05, 1),
        "min_value": st.floats(0, 0.2),
    }),
    "uniform": st.fixed_dictionaries({"n": st.integers(1, 10), "per_round": st.none() | st.integers(1, 4)}),
    "two_stage": st.fixed_dictionaries({
        "explore_fraction": st.floats(0.05, 0.95),
        "n": st.integers(1, 10),
        "hopeless_share": st.floats(0, 0.9),
    }),
    "difficulty": st.fixed_dictionaries({
        "prior_strength": st.floats(0, 5),
        "initial_fraction": st.floats(0.1, 1),
        "round_fraction": st.floats(0.1, 1),
        "min_gain": st.floats(0, 0.01),
        "max_samples": st.integers(1, 16),
    }),
}


@dataclass(frozen=True)
class QueryModel:
    cap: int
    p_right: float
    n_wrong: int
    p_null: float
    prefill: int
    prior: float | None


queries_st = st.lists(
    st.builds(
        QueryModel,
        cap=st.integers(0, 15),
        p_right=st.floats(0, 1),
        n_wrong=st.integers(1, 4),
        p_null=st.floats(0, 0.3),
        prefill=st.integers(0, 3) | st.just(0),
        prior=st.none() | st.floats(0, 1),
    ),
    min_size=1,
    max_size=10,
)


@dataclass(frozen=True)
class Scenario:
    queries: list[QueryModel]
    samples: int | None
    tokens: int | None
    tokens_per_sample: int
    verifier: bool
    seed: int


scenarios = st.builds(
    Scenario,
    queries=queries_st,
    samples=st.none() | st.integers(0, 80),
    tokens=st.none() | st.integers(0, 3000),
    tokens_per_sample=st.integers(1, 100),
    verifier=st.booleans(),
    seed=st.integers(0, 2**16),
)


def sample_for(q: QueryModel, rng: random.Random, verifier: bool, tokens: int) -> Sample:
    u = rng.random()
    right = u < q.p_right
    if right:
        answer: str | None = "right"
    elif rng.random() < q.p_null:
        answer = None
    else:
        answer = f"wrong{rng.randrange(q.n_wrong)}"
    score = (rng.uniform(0.5, 1.0) if right else rng.uniform(0.0, 0.6)) if verifier else None
    return Sample(answer=answer, score=score, tokens=tokens)


def make_states(sc: Scenario, rng: random.Random) -> list[QueryState]:
    states = []
    for i, q in enumerate(sc.queries):
        pre = [sample_for(q, rng, sc.verifier, sc.tokens_per_sample) for _ in range(min(q.prefill, q.cap))]
        states.append(QueryState(id=f"q{i}", cap=q.cap, features={"chars": 40.0 * i, "digits": float(i % 3)},
                                 samples=pre, prior_difficulty=q.prior))
    return states


def run(name: str, params: dict[str, Any], sc: Scenario, allocator: Any = None) -> tuple[Trace, list[QueryState], Any]:
    rng = random.Random(sc.seed)
    alloc = allocator or create(name, {**params, "tokens_per_sample": sc.tokens_per_sample}, random.Random(sc.seed))
    states = make_states(sc, rng)
    models = {st_.id: q for st_, q in zip(states, sc.queries, strict=True)}

    def draw(state: QueryState, k: int) -> list[Sample]:
        return [sample_for(models[state.id], rng, sc.verifier, sc.tokens_per_sample) for _ in range(k)]

    trace = simulate(alloc, states, Budget(sc.samples, sc.tokens), draw, max_rounds=2000)
    return trace, states, alloc


def policy_max(name: str, params: dict[str, Any], budget_set: bool) -> int | None:
    if name == "fixed":
        return int(params["n"])
    if name in ("adaptive_consistency", "esc", "margin", "calibrated_margin", "elimination", "greedy", "difficulty"):
        return int(params["max_samples"])
    if name == "uniform" and not budget_set:
        return int(params["n"])
    return None


def check_run(name: str, params: dict[str, Any], sc: Scenario, trace: Trace, states: list[QueryState]) -> None:
    assert trace.stop in {"policy", "budget", "tokens"}
    prefilled = {f"q{i}": min(q.prefill, q.cap) for i, q in enumerate(sc.queries)}
    drawn = {s.id: s.spent - prefilled[s.id] for s in states}
    assert sum(drawn.values()) == trace.samples
    if sc.samples is not None:
        assert trace.samples <= sc.samples
    if sc.tokens is not None:
        used = 0
        for plan in trace.plans:
            assert sum(plan.values()) * sc.tokens_per_sample <= sc.tokens - used
            used += sum(plan.values()) * sc.tokens_per_sample
        assert trace.tokens <= sc.tokens
    cap_max = policy_max(name, params, sc.samples is not None or sc.tokens is not None)
    for s in states:
        assert s.spent <= s.cap
        if cap_max is not None and drawn[s.id] > 0:
            assert s.spent <= max(cap_max, prefilled[s.id])
    fresh = all(q.prefill == 0 for q in sc.queries)
    open_queries = [s for s in states if s.cap > 0]
    if fresh and sc.tokens is None and sc.samples is not None and sc.samples >= len(open_queries):
        assert all(s.spent >= 1 for s in open_queries), [s.spent for s in states]


def check_elimination_state(
    alloc: Elimination, params: dict[str, Any], sc: Scenario, trace: Trace, states: list[QueryState]
) -> None:
    rule = BetaRule(params["consistency_threshold"], params["max_samples"])
    for s in states:
        stats = alloc._cache.by_id.get(s.id)
        if stats is not None and stats.n == s.spent:
            assert (stats.top, stats.second) == s.top_two()
            assert stats.nulls == sum(x.answer is None for x in s.samples)
        budget_ended = sc.tokens is not None or (sc.samples is not None and trace.samples >= sc.samples)
        if trace.stop == "policy" and not budget_ended:  # every query is solved or out of room
            scores = [x.score for x in s.samples if x.score is not None]
            a, b = s.top_two()
            solved = (max(scores) >= params["gamma"]) if scores else (
                s.spent >= params["min_samples"] and rule.solved(a, b)
            )
            assert solved or s.spent >= min(s.cap, params["max_samples"])


def check_greedy_state(
    alloc: Greedy, params: dict[str, Any], sc: Scenario, trace: Trace, states: list[QueryState]
) -> None:
    """Counts match the samples; an empty plan before the budget ends means every query is done."""
    rule = BetaRule(params["consistency_threshold"], max(params["max_samples"], 2))
    budget_ended = sc.tokens is not None or (sc.samples is not None and trace.samples >= sc.samples)
    for s in states:
        stats = alloc._cache.by_id.get(s.id)
        if stats is not None and stats.n == s.spent:
            assert (stats.top, stats.second) == s.top_two()
        if trace.stop == "policy" and not budget_ended and s.spent >= params["first"]:
            scores = [x.score for x in s.samples if x.score is not None]
            a, b = s.top_two()
            done = (max(scores) >= params["gamma"]) if scores else (
                s.spent >= params["min_samples"] and rule.solved(a, b)
            )
            room = min(s.cap, params["max_samples"]) - s.spent
            if done or room <= 0:
                continue
            # otherwise its value per sample fell to min_value (hazards of unsolved queries stay > 0)
            assert params["min_value"] > 0 or not scores
            if not scores:
                value = VoteValue(params["lookahead"])(a, b, room) * (a + b + 1) / (s.spent + 2)
                assert value <= params["min_value"]


@pytest.mark.parametrize("name", sorted(PARAMS))
@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), sc=scenarios)
def test_runs_keep_the_contract(name: str, data: st.DataObject, sc: Scenario) -> None:
    params = data.draw(PARAMS[name], label="params")
    if name == "adaptive_consistency":
        params["min_samples"] = min(params["min_samples"], params["max_samples"])
    trace, states, alloc = run(name, params, sc)
    check_run(name, params, sc, trace, states)
    if isinstance(alloc, Elimination):
        check_elimination_state(alloc, params, sc, trace, states)
    if isinstance(alloc, Greedy):
        check_greedy_state(alloc, params, sc, trace, states)
    budget_ended = sc.tokens is not None or (sc.samples is not None and trace.samples >= sc.samples)
    if name == "margin" and trace.stop == "policy" and not budget_ended:
        stop = MarginParams.model_validate(params)
        for s in states:  # every query reached the lead, ran out of room, or gave up without answers
            assert (weighted_lead(s) >= params["margin"] or s.spent >= min(s.cap, params["max_samples"])
                    or gave_up(s, stop))

    again, states2, _ = run(name, params, sc)
    assert again.plans == trace.plans
    assert [s.samples for s in states2] == [s.samples for s in states]

    if alloc.shared:  # the learned model keeps serving runs within the contract
        alloc.learn(states)
        trace3, states3, _ = run(name, params, sc, allocator=alloc)
        check_run(name, params, sc, trace3, states3)


@pytest.mark.parametrize("name", sorted(PARAMS))
@settings(max_examples=30, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), sc=scenarios)
def test_every_query_with_room_gets_a_sample_when_the_budget_covers_the_batch(
    name: str, data: st.DataObject, sc: Scenario
) -> None:
    fresh = [QueryModel(q.cap, q.p_right, q.n_wrong, q.p_null, 0, q.prior) for q in sc.queries]
    open_count = sum(q.cap > 0 for q in fresh)
    samples = data.draw(st.integers(open_count, 80), label="samples")
    sc = Scenario(fresh, samples, None, sc.tokens_per_sample, sc.verifier, sc.seed)
    params = data.draw(PARAMS[name], label="params")
    if name == "adaptive_consistency":
        params["min_samples"] = min(params["min_samples"], params["max_samples"])
    _, states, _ = run(name, params, sc)
    assert all(s.spent >= 1 for s in states if s.cap > 0)
