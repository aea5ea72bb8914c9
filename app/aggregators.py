"""Aggregators: pick one sample out of the samples of one query.

Every aggregator sees :class:`Candidate` s (canonical answer keys, verifier scores) and returns a
:class:`Selection`: the chosen sample's ``index``, its answer, the votes per answer, a confidence in
[0, 1] and the per-answer scores it computed. Candidates with ``answer=None`` (nothing parsed) never
vote. Ties are broken deterministically: the answer that appeared first (lowest position in the
candidate sequence) wins, and within an answer the earliest sample wins.

Truncated candidates (stopped at their token limit) do not vote while any complete candidate has an
answer; they then count against the leader: ``majority`` confidence is ``top / (answered +
truncated)``, ``weighted_majority``'s ``W(winner) / (sum_a W(a) + sum of the truncated scores)``.
When every answered candidate is truncated, they vote as usual.

| name                | winner                                              | confidence              |
|---------------------|-----------------------------------------------------|-------------------------|
| ``majority``        | most votes                                          | top votes / answered    |
| ``weighted_majority``| largest sum of scores (then votes)                 | winner's sum / all sums |
| ``best_of_n``       | highest-scored sample                               | that score              |
| ``verifier_rerank`` | highest best-score answer (then votes)              | winner's best score     |
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import ClassVar


@dataclass(frozen=True, slots=True)
class Candidate:
    """One sample as aggregators see it: ``answer`` is the canonical key (``None`` if none parsed),
    ``score`` the verifier score in [0, 1] (``None`` without a verifier)."""

    index: int
    text: str
    answer: str | None
    score: float | None
    logprob: float | None = None
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class Selection:
    """The chosen sample (``index`` is its :attr:`Candidate.index`) and how it was chosen."""

    index: int
    answer: str | None
    votes: dict[str, int]
    confidence: float
    answer_scores: dict[str, float]


class UnknownAggregatorError(KeyError):
    """No aggregator is registered under that name."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown aggregator"


def count_votes(candidates: Sequence[Candidate]) -> dict[str, int]:
    """Votes per answer, in order of first appearance (dict order is the tie-break order)."""
    votes: dict[str, int] = {}
    for c in candidates:
        if c.answer is not None:
            votes[c.answer] = votes.get(c.answer, 0) + 1
    return votes


def _best_of(candidates: Sequence[Candidate]) -> Candidate:
    """Highest-scored candidate; the earliest one on ties."""
    best = candidates[0]
    for c in candidates[1:]:
        if _score(c) > _score(best):
            best = c
    return best


def _score(c: Candidate) -> float:
    if c.score is None:  # Aggregator.select has already rejected this; kept for the type checker
        raise ValueError(f"sample {c.index} has no verifier score")
    return c.score


def _first_max(keys: dict[str, tuple[float, ...]]) -> str:
    """The key with the largest tuple; the first-inserted one on ties."""
    best_key = next(iter(keys))
    for k, v in keys.items():
        if v > keys[best_key]:
            best_key = k
    return best_key


class Aggregator(ABC):
    """Picks one sample. ``needs_verifier`` aggregators require every candidate to have a score.

    ``select`` raises ``ValueError`` on an empty sequence, or (``needs_verifier``) on a missing score.
    """

    name: ClassVar[str]
    needs_verifier: ClassVar[bool] = False

    def select(self, candidates: Sequence[Candidate]) -> Selection:
        if not candidates:
            raise ValueError(f"{self.name}: no candidates to select from")
        if self.needs_verifier:
            missing = [c.index for c in candidates if c.score is None]
            if missing:
                raise ValueError(
                    f"aggregator {self.name!r} needs verifier scores; samples {missing} have none "
                    "(configure a verifier in the policy)"
                )
        held = [c for c in candidates if c.truncated and c.answer is not None]
        if held and any(c.answer is not None and not c.truncated for c in candidates):
            voting = [replace(c, answer=None) if c.truncated else c for c in candidates]
            return self._against(self._select(voting), voting, held)
        return self._select(candidates)

    @abstractmethod
    def _select(self, candidates: Sequence[Candidate]) -> Selection: ...

    def _against(self, sel: Selection, voting: Sequence[Candidate], held: Sequence[Candidate]) -> Selection:
        """``sel`` with the held-back truncated candidates counted against its leader (default: as is)."""
        return sel


class MajorityVote(Aggregator):
    """Most votes wins; the first sample carrying the winning answer is returned.

    ``answer_scores[a] = votes[a] / answered``; no parsed answer at all -> first sample, ``None``,
    confidence 0.
    """

    name = "majority"

    def _select(self, candidates: Sequence[Candidate]) -> Selection:
        votes = count_votes(candidates)
        if not votes:
            return Selection(candidates[0].index, None, {}, 0.0, {})
        answered = sum(votes.values())
        winner = _first_max({a: (float(v),) for a, v in votes.items()})
        index = next(c.index for c in candidates if c.answer == winner)
        shares = {a: v / answered for a, v in votes.items()}
        return Selection(index, winner, votes, shares[winner], shares)

    def _against(self, sel: Selection, voting: Sequence[Candidate], held: Sequence[Candidate]) -> Selection:
        answered = sum(sel.votes.values())
        top = sel.votes.get(sel.answer, 0) if sel.answer is not None else 0
        return replace(sel, confidence=top / (answered + len(held)) if answered else 0.0)


class WeightedMajority(Aggregator):
    """``W(a) = sum of scores of the samples answering a``; the largest ``W`` wins (then more
    votes, then first appearance). Returns the winner's highest-scored sample.

    ``confidence = W(winner) / sum_a W(a)`` (0 when all weights are 0); no parsed answer ->
    the highest-scored sample overall, answer ``None``, confidence 0.
    """

    name = "weighted_majority"
    needs_verifier = True

    def _select(self, candidates: Sequence[Candidate]) -> Selection:
        votes = count_votes(candidates)
        if not votes:
            return Selection(_best_of(candidates).index, None, {}, 0.0, {})
        weights = dict.fromkeys(votes, 0.0)
        for c in candidates:
            if c.answer is not None:
                weights[c.answer] += _score(c)
        winner = _first_max({a: (w, float(votes[a])) for a, w in weights.items()})
        total = sum(weights.values())
        best = _best_of([c for c in candidates if c.answer == winner])
        confidence = weights[winner] / total if total > 0 else 0.0
        return Selection(best.index, winner, votes, confidence, weights)

    def _against(self, sel: Selection, voting: Sequence[Candidate], held: Sequence[Candidate]) -> Selection:
        total = sum(sel.answer_scores.values()) + sum(_score(c) for c in held)
        winner = sel.answer_scores.get(sel.answer, 0.0) if sel.answer is not None else 0.0
        return replace(sel, confidence=winner / total if total > 0 else 0.0)


class BestOfN(Aggregator):
    """The highest-scored sample (earliest on ties), whatever its answer; confidence = its score.

    ``answer_scores[a]`` = best score among the samples answering ``a``.
    """

    name = "best_of_n"
    needs_verifier = True

    def _select(self, candidates: Sequence[Candidate]) -> Selection:
        best = _best_of(candidates)
        return Selection(best.index, best.answer, count_votes(candidates), _score(best), _best_scores(candidates))


class VerifierRerank(Aggregator):
    """Answers ranked by their best score, then votes, then first appearance; returns the winning
    answer's highest-scored sample. ``confidence`` = the winner's best score.

    No parsed answer -> behaves like ``best_of_n`` (answer ``None``).
    """

    name = "verifier_rerank"
    needs_verifier = True

    def _select(self, candidates: Sequence[Candidate]) -> Selection:
        votes = count_votes(candidates)
        if not votes:
            best = _best_of(candidates)
            return Selection(best.index, None, {}, _score(best), {})
        best_scores = _best_scores(candidates)
        winner = _first_max({a: (s, float(votes[a])) for a, s in best_scores.items()})
        best = _best_of([c for c in candidates if c.answer == winner])
        return Selection(best.index, winner, votes, best_scores[winner], best_scores)


def _best_scores(candidates: Sequence[Candidate]) -> dict[str, float]:
    """Best score per answer, in order of first appearance."""
    out: dict[str, float] = {}
    for c in candidates:
        if c.answer is not None:
            s = _score(c)
            out[c.answer] = max(out.get(c.answer, s), s)
    return out


def builtin_aggregators() -> dict[str, type[Aggregator]]:
    """A fresh name -> class map of the built-in aggregators."""
    return {cls.name: cls for cls in (MajorityVote, WeightedMajority, BestOfN, VerifierRerank)}


def create_aggregator(name: str) -> Aggregator:
    """An aggregator by name; raises :class:`UnknownAggregatorError` listing the known names."""
    registry = builtin_aggregators()
    try:
        cls = registry[name]
    except KeyError:
        raise UnknownAggregatorError(f"unknown aggregator {name!r}; known: {', '.join(sorted(registry))}") from None
    return cls()
