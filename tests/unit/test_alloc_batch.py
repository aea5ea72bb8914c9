"""Exact cases of the batch policies: elimination (+ exploration rules), uniform, two_stage, difficulty."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence

import pytest

from allocators import (
    Budget,
    Difficulty,
    DifficultyParams,
    Elimination,
    EliminationParams,
    OnlineLogistic,
    QueryState,
    Sample,
    TwoStage,
    TwoStageParams,
    Uniform,
    UniformParams,
    majority_accuracy,
    majority_gain,
    simulate,
)
from allocators.exploration import entropy_scores, gap_scores, rank, selection_size, ucb_scores
from allocators.stats import BetaRule, VoteStats


def scripted(answers: dict[str, Sequence[str | None]], scores: dict[str, Sequence[float]] | None = None):  # type: ignore[no-untyped-def]
    streams: dict[str, Iterator[str | None]] = {q: iter(a) for q, a in answers.items()}
    score_streams: dict[str, Iterator[float]] = {q: iter(s) for q, s in (scores or {}).items()}

    def draw(state: QueryState, k: int) -> list[Sample]:
        out = []
        for _ in range(k):
            score = next(score_streams[state.id]) if state.id in score_streams else None
            out.append(Sample(answer=next(streams[state.id]), score=score, tokens=10))
        return out

    return draw


def elim(**params: object) -> Elimination:
    return Elimination(EliminationParams.model_validate(params), random.Random(0))


def stats_of(answers: Sequence[str | None], scores: Sequence[float] | None = None) -> VoteStats:
    samples = [Sample(a, score=None if scores is None else scores[i]) for i, a in enumerate(answers)]
    s = VoteStats(samples)
    s.update(samples)
    return s


# --- elimination -------------------------------------------------------------------------------


def test_elimination_retires_consistent_queries_and_caps_the_rest() -> None:
    alloc = elim(consistency_threshold=0.9, min_samples=2, max_samples=10)
    states = [QueryState(id=q, cap=50) for q in ("easy", "split", "junk")]
    draw = scripted({"easy": ["x"] * 20, "split": ["x", "y"] * 10, "junk": [None] * 20})
    trace = simulate(alloc, states, Budget(), draw)
    assert [s.spent for s in states] == [3, 10, 10]
    assert trace.plans[:3] == [{"easy": 1, "split": 1, "junk": 1}] * 3
    assert trace.plans[3:] == [{"split": 1, "junk": 1}] * 7


def test_elimination_with_scores_uses_gamma_not_consistency() -> None:
    alloc = elim(gamma=0.8, max_samples=6)
    states = [QueryState(id="good", cap=50), QueryState(id="agreeing", cap=50)]
    draw = scripted(
        {"good": ["a", "b", "c"] * 3, "agreeing": ["x"] * 9},
        {"good": [0.3, 0.85, 0.1] * 3, "agreeing": [0.5] * 9},
    )
    simulate(alloc, states, Budget(), draw)
    assert [s.spent for s in states] == [2, 6]


def test_elimination_final_partial_round_goes_to_the_first_ranked() -> None:
    alloc = elim(k=2)
    states = [QueryState(id=f"q{i}", cap=50) for i in range(3)]
    assert alloc.plan(states, Budget(samples=5)) == {"q0": 2, "q1": 2, "q2": 1}
    assert alloc.plan(states, Budget(samples=2)) == {"q0": 1, "q1": 1}
    states[0].samples.append(Sample("x"))  # 'all' ranks the least-sampled first
    assert alloc.plan(states, Budget(samples=5)) == {"q1": 2, "q2": 2, "q0": 1}
    assert alloc.plan(states, Budget(samples=0)) == {}


def test_elimination_k_is_capped_by_room_and_max_samples() -> None:
    alloc = elim(k=4, max_samples=6)
    states = [QueryState(id="a", cap=3), QueryState(id="b", cap=50, samples=[Sample(str(i)) for i in range(4)])]
    assert alloc.plan(states, Budget()) == {"a": 3, "b": 2}


def test_elimination_token_budget() -> None:
    alloc = elim(tokens_per_sample=100)
    states = [QueryState(id=f"q{i}", cap=50) for i in range(20)]
    plan = alloc.plan(states, Budget(tokens=1000))
    assert sum(plan.values()) == 10
    for st in states:
        st.samples.append(Sample(str(st.id), tokens=50))
    assert sum(alloc.plan(states, Budget(tokens=1000)).values()) == 20


def test_elimination_non_all_rules_try_every_query_first() -> None:
    for rule in ("ucb", "gap", "entropy"):
        alloc = elim(exploration=rule, fraction=0.25)
        states = [QueryState(id=f"q{i}", cap=50) for i in range(8)]
        assert alloc.plan(states, Budget()) == {f"q{i}": 1 for i in range(8)}
        for st in states:
            st.samples.append(Sample("x" if st.id < "q4" else st.id))
        assert len(alloc.plan(states, Budget())) == 2  # ceil(0.25 * 8)


def test_ucb_scores() -> None:
    a, b = stats_of(["x"] * 4), stats_of(["x"])
    got = ucb_scores([a, b, stats_of([])], total=5, c=1.0)
    assert got[0] == pytest.approx(5 / 6 + math.sqrt(math.log(5) / 4))
    assert got[1] == pytest.approx(2 / 3 + math.sqrt(math.log(5)))
    assert got[2] == math.inf
    assert rank(got) == [2, 1, 0]
    scored = stats_of(["x", "y"], [0.2, 0.6])
    assert ucb_scores([scored], total=1, c=0.0) == [pytest.approx(0.4)]


def test_gap_scores() -> None:
    rule = BetaRule(0.9, 40)
    near = stats_of(["x", "x"])  # needs min_top(0) - 2 = 1 more
    far = stats_of(["x", "y"])  # needs min_top(1) - 1 = 4 more
    scored = stats_of(["x"], [0.7])
    young = stats_of(["x"])  # min_samples 3: needs max(3 - 1, 3 - 1) = 2
    got = gap_scores([near, far, scored, young], gamma=0.8, rule=rule, min_samples=3)
    assert got[:2] == [-1.0, -4.0]
    assert got[2] == pytest.approx(-0.1)
    assert got[3] == -2.0
    assert rank(got) == [2, 0, 3, 1]


def test_entropy_scores_rank_spread_first_and_hopeless_last() -> None:
    unanimous = stats_of(["x"] * 3)
    split = stats_of(["x", "y", "x", "y"])
    three = stats_of(["x", "y", "z"])
    hopeless = stats_of([None] * 6 + ["x", "y"])
    spread = stats_of([str(i) for i in range(8)])
    got = entropy_scores([unanimous, split, three, hopeless, spread], hopeless_after=8, hopeless_share=0.25)
    assert got == [0.0, pytest.approx(0.5), pytest.approx(1.0), -1.0, -1.0]  # H / ln N
    assert rank(got)[-2:] == [3, 4]
    assert entropy_scores([stats_of(["x", "x", "y"])], 8, 0.25)[0] == pytest.approx(
        -(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3)) / math.log(3)
    )


def test_selection_size() -> None:
    assert selection_size(10, 0, 0.5) == 5
    assert selection_size(10, 7, 0.5) == 7
    assert selection_size(3, 0, 0.1) == 1
    assert selection_size(3, 0, 1.0) == 3


# --- uniform -----------------------------------------------------------------------------------


def test_uniform_splits_evenly_and_gives_the_remainder_by_seeded_order() -> None:
    states = [QueryState(id=f"q{i}", cap=50) for i in range(3)]
    alloc = Uniform(UniformParams(), random.Random(0))
    order = ["q0", "q1", "q2"]
    random.Random(0).shuffle(order)
    assert alloc.plan(states, Budget(samples=10)) == {order[0]: 4, order[1]: 3, order[2]: 3}


def test_uniform_caps_move_the_excess_to_others_and_rounds_chunk() -> None:
    states = [QueryState(id="small", cap=1), QueryState(id="a", cap=50), QueryState(id="b", cap=50)]
    alloc = Uniform(UniformParams(per_round=2), random.Random(0))
    trace = simulate(alloc, states, Budget(samples=9), scripted({q.id: ["x"] * 9 for q in states}))
    assert [s.spent for s in states] == [1, 4, 4]
    assert trace.rounds == 2


def test_uniform_without_budget_draws_n_each() -> None:
    states = [QueryState(id=f"q{i}", cap=5) for i in range(3)]
    alloc = Uniform(UniformParams(n=8), random.Random(0))
    assert alloc.plan(states, Budget()) == {"q0": 5, "q1": 5, "q2": 5}


# --- two_stage ---------------------------------------------------------------------------------


def test_two_stage_explores_then_commits_by_disagreement() -> None:
    states = [QueryState(id=q, cap=100) for q in ("easy", "hopeless", "split", "leaning")]
    draw = scripted({
        "easy": ["x"] * 4,
        "hopeless": [None] * 4,
        "split": ["x", "y", "x", "y"] + ["x"] * 60,
        "leaning": ["x", "x", "x", "y"] + ["x"] * 60,
    })
    alloc = TwoStage(TwoStageParams(), random.Random(0))
    trace = simulate(alloc, states, Budget(samples=64), draw)
    # stage 1: max(ceil(0.25 * 64), 4) = 16 -> 4 each; stage 2: 48 split 0.5 : 1/3 -> 28.8 : 19.2
    assert trace.plans[0] == {"easy": 4, "hopeless": 4, "split": 4, "leaning": 4}
    assert [s.spent for s in states] == [4, 4, 4 + 29, 4 + 19]
    assert alloc.disagreement(states[0]) == 0.0
    assert trace.rounds == 2


def test_two_stage_gives_everyone_a_sample_when_the_budget_allows() -> None:
    states = [QueryState(id=f"q{i}", cap=10) for i in range(10)]
    alloc = TwoStage(TwoStageParams(explore_fraction=0.1), random.Random(3))
    assert len(alloc.plan(states, Budget(samples=12))) == 10


# --- difficulty --------------------------------------------------------------------------------


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.55, 0.7, 0.9, 0.99])
def test_majority_gain_matches_the_accuracy_model(p: float) -> None:
    assert majority_accuracy(1, p) == pytest.approx(p)
    assert majority_accuracy(2, p) == pytest.approx(p)
    assert majority_gain(0, p) == p
    for n in range(1, 25):
        want = (majority_accuracy(n + 2, p) - majority_accuracy(n, p)) / 2
        assert majority_gain(n, p) == pytest.approx(want, abs=1e-12)
        if p > 0.5:
            assert majority_gain(n + 2, p) <= majority_gain(n, p)


def test_online_logistic_learns_and_is_seeded() -> None:
    model = OnlineLogistic(prior=0.5, lr=0.2, rng=random.Random(1))
    assert model.predict({"chars": 10.0}) == pytest.approx(0.5)
    for _ in range(200):
        model.update({"chars": 10.0}, 1.0)
        model.update({"chars": 5000.0}, 0.0)
    assert model.predict({"chars": 10.0}) > 0.7
    assert model.predict({"chars": 5000.0}) < 0.3
    twin = OnlineLogistic(prior=0.5, lr=0.2, rng=random.Random(1))
    for _ in range(200):
        twin.update({"chars": 10.0}, 1.0)
        twin.update({"chars": 5000.0}, 0.0)
    assert twin.weights == model.weights and twin.bias == model.bias


def diff(**params: object) -> Difficulty:
    return Difficulty(DifficultyParams.model_validate(params), random.Random(0))


def test_difficulty_streaming_uses_difficulty_bins() -> None:
    alloc = diff()
    assert alloc.shared is True
    easy = QueryState(id="e", cap=64, prior_difficulty=0.05)  # p0 = 0.95 -> bin >= 0.85 -> 3
    hard = QueryState(id="h", cap=64, prior_difficulty=0.55)  # p0 = 0.45 -> bin [0.3, 0.6) -> 16
    assert alloc.plan([easy], Budget()) == {"e": 3}
    assert alloc.plan([hard], Budget()) == {"h": 16}
    easy.samples.extend([Sample("x")] * 3)  # p = (2 * 0.95 + 3) / 5 = 0.98 -> target 3: done
    assert alloc.plan([easy], Budget()) == {}
    hard.samples.extend([Sample(str(i % 4)) for i in range(16)])  # p = (0.9 + 4) / 18 = 0.27 -> 4: done
    assert alloc.plan([hard], Budget()) == {}
    split = QueryState(id="s", cap=64, prior_difficulty=0.05, samples=[Sample("x"), Sample("y"), Sample("z")])
    # p = (1.9 + 1) / 5 = 0.58 -> bin [0.3, 0.6) -> 16 in all: 13 more
    assert alloc.plan([split], Budget()) == {"s": 13}


def test_difficulty_first_batch_round_scales_binned_sizes_to_the_budget() -> None:
    alloc = diff()
    priors = [0.05, 0.55, 0.3, 0.8]  # p0 = .95, .45, .7, .2 -> bins 3, 16, 8, 4
    states = [QueryState(id=f"q{i}", cap=64, prior_difficulty=d) for i, d in enumerate(priors)]
    # total = max(4, floor(0.5 * 20)) = 10: one each, then 6 split as [2, 15, 7, 3] -> [0, 3, 2, 1]
    assert alloc.plan(states, Budget(samples=20)) == {"q0": 1, "q1": 4, "q2": 3, "q3": 2}
    assert alloc.plan(states, Budget(samples=1000)) == {"q0": 3, "q1": 16, "q2": 8, "q3": 4}


def test_difficulty_greedy_rounds_follow_marginal_gain() -> None:
    alloc = diff(prior_strength=0.0)
    settled = QueryState(id="settled", cap=64, samples=[Sample("x")] * 9 + [Sample("y")])  # p = 0.9, n=10
    open_ = QueryState(id="open", cap=64, samples=[Sample("x")] * 2 + [Sample("y")])  # p = 2/3, n = 3
    hopeless = QueryState(id="hopeless", cap=64, samples=[Sample(str(i)) for i in range(5)])  # p = 0.2
    plan = alloc.plan([settled, open_, hopeless], Budget(samples=8))
    assert sum(plan.values()) == 4  # ceil(0.5 * 8)
    assert "hopeless" not in plan
    assert plan["open"] >= plan.get("settled", 0)
    assert majority_gain(3, 2 / 3) > majority_gain(10, 0.9)


def test_difficulty_learn_updates_the_shared_model() -> None:
    alloc = diff(learning_rate=0.5)
    feats = {"chars": 800.0, "digits": 30.0}
    before = alloc.predict(QueryState(id="x", cap=8, features=feats))
    finished = [QueryState(id=f"f{i}", cap=8, features=feats, samples=[Sample(str(j)) for j in range(4)])
                for i in range(20)]
    alloc.learn(finished)
    assert alloc.model.seen == 20
    assert alloc.predict(QueryState(id="x", cap=8, features=feats)) < before
    scored = QueryState(id="s", cap=8, features=feats, samples=[Sample("a", score=1.0)] * 2)
    for _ in range(40):
        alloc.learn([scored])
    assert alloc.predict(QueryState(id="x", cap=8, features=feats)) > 0.5


def test_difficulty_params_validation() -> None:
    with pytest.raises(ValueError, match="bin_samples"):
        DifficultyParams(success_edges=(0.5,), bin_samples=(1, 2, 3))
    with pytest.raises(ValueError, match="success_edges"):
        DifficultyParams(success_edges=(0.6, 0.5), bin_samples=(1, 2, 3))
