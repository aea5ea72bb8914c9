"""Aggregators: exact selections and deterministic tie-breaks."""

from __future__ import annotations

import pytest

from app.aggregators import (
    Aggregator,
    Candidate,
    Selection,
    UnknownAggregatorError,
    builtin_aggregators,
    create_aggregator,
)


def cands(answers: list[str | None], scores: list[float | None] | None = None) -> list[Candidate]:
    scores = scores if scores is not None else [None] * len(answers)
    return [Candidate(i, f"sample {i}", a, s) for i, (a, s) in enumerate(zip(answers, scores, strict=True))]


def test_registry() -> None:
    assert set(builtin_aggregators()) == {"majority", "weighted_majority", "best_of_n", "verifier_rerank"}
    assert isinstance(create_aggregator("majority"), Aggregator)
    with pytest.raises(UnknownAggregatorError, match="unknown aggregator 'nope'") as exc:
        create_aggregator("nope")
    assert isinstance(exc.value, KeyError)
    assert not builtin_aggregators()["majority"].needs_verifier
    assert all(builtin_aggregators()[n].needs_verifier for n in ("weighted_majority", "best_of_n"))


def test_majority() -> None:
    sel = create_aggregator("majority").select(cands(["1", None, "2", "2", "1", "2"]))
    assert sel == Selection(2, "2", {"1": 2, "2": 3}, 3 / 5, {"1": 2 / 5, "2": 3 / 5})


def test_majority_tie_goes_to_first_appearance() -> None:
    sel = create_aggregator("majority").select(cands([None, "b", "a", "a", "b"]))
    assert (sel.index, sel.answer, sel.confidence) == (1, "b", 0.5)


def test_majority_without_answers() -> None:
    sel = create_aggregator("majority").select(cands([None, None]))
    assert sel == Selection(0, None, {}, 0.0, {})


def test_majority_uses_candidate_index() -> None:
    sel = create_aggregator("majority").select([Candidate(7, "", "x", None), Candidate(3, "", "y", None)])
    assert sel.index == 7


def test_weighted_majority() -> None:
    # "a": 0.2 + 0.3 = 0.5 with 2 votes; "b": 0.9 with 1 vote -> b wins on weight.
    sel = create_aggregator("weighted_majority").select(cands(["a", "b", "a", None], [0.2, 0.9, 0.3, 1.0]))
    assert sel.index == 1 and sel.answer == "b"
    assert sel.votes == {"a": 2, "b": 1}
    assert sel.answer_scores == pytest.approx({"a": 0.5, "b": 0.9})
    assert sel.confidence == pytest.approx(0.9 / 1.4)


def test_weighted_majority_ties() -> None:
    # equal weight: more votes wins; then the highest-scored sample of that answer (earliest on ties)
    sel = create_aggregator("weighted_majority").select(cands(["a", "b", "b", "b"], [0.6, 0.2, 0.2, 0.2]))
    assert (sel.index, sel.answer) == (1, "b")
    # equal weight and votes: first appearance wins
    sel = create_aggregator("weighted_majority").select(cands(["a", "b"], [0.0, 0.0]))
    assert (sel.index, sel.answer, sel.confidence) == (0, "a", 0.0)


def test_weighted_majority_without_answers() -> None:
    sel = create_aggregator("weighted_majority").select(cands([None, None], [0.1, 0.7]))
    assert sel == Selection(1, None, {}, 0.0, {})


def test_best_of_n() -> None:
    sel = create_aggregator("best_of_n").select(cands(["a", "b", None, "a"], [0.4, 0.8, 0.95, 0.8]))
    assert sel == Selection(2, None, {"a": 2, "b": 1}, 0.95, {"a": 0.8, "b": 0.8})
    sel = create_aggregator("best_of_n").select(cands(["a", "b", "c"], [0.4, 0.8, 0.8]))
    assert (sel.index, sel.answer, sel.confidence) == (1, "b", 0.8)


def test_verifier_rerank() -> None:
    # best scores: a 0.9, b 0.9, c 0.95 -> c wins even with one vote
    sel = create_aggregator("verifier_rerank").select(cands(["a", "a", "b", "c", "b"], [0.1, 0.9, 0.9, 0.95, 0.3]))
    assert sel == Selection(3, "c", {"a": 2, "b": 2, "c": 1}, 0.95, {"a": 0.9, "b": 0.9, "c": 0.95})


def test_verifier_rerank_votes_break_ties() -> None:
    sel = create_aggregator("verifier_rerank").select(cands(["a", "b", "b", "a", "b"], [0.9, 0.5, 0.9, 0.2, 0.1]))
    assert (sel.index, sel.answer, sel.confidence) == (2, "b", 0.9)
    sel = create_aggregator("verifier_rerank").select(cands(["a", "b"], [0.5, 0.5]))
    assert (sel.index, sel.answer) == (0, "a")


def test_verifier_rerank_without_answers() -> None:
    sel = create_aggregator("verifier_rerank").select(cands([None, None], [0.3, 0.2]))
    assert sel == Selection(0, None, {}, 0.3, {})


@pytest.mark.parametrize("name", ["weighted_majority", "best_of_n", "verifier_rerank"])
def test_missing_scores_raise(name: str) -> None:
    with pytest.raises(ValueError, match="needs verifier scores"):
        create_aggregator(name).select(cands(["a", "b"], [0.5, None]))


@pytest.mark.parametrize("name", sorted(builtin_aggregators()))
def test_empty_raises(name: str) -> None:
    with pytest.raises(ValueError, match="no candidates"):
        create_aggregator(name).select([])
