"""The allocator contract shared by the service, the replay evaluator and tests.

The engine calls ``plan(states, budget)`` and, for every query id in the returned plan, makes sure
that many more samples are on their way: ``plan[q]`` counts the samples ``q`` still needs beyond its
finished ones, *including* the ``state.in_flight`` already started, so the engine starts
``plan[q] - in_flight`` new ones. In the ``rounds`` schedule nothing is in flight when ``plan`` is
called (each round is awaited whole), so ``plan[q]`` is simply the next round's samples; in the
``stream`` schedule ``plan`` is called again each time a sample finishes, and a query for which
:meth:`Allocator.finished` holds has its in-flight samples cancelled. An allocator written for rounds
therefore runs unchanged in both. The loop ends when the plan is empty, nothing is in flight, or the
budget is spent. ``plan`` is pure and cheap: no I/O, no await, and every random choice goes through
the ``random.Random`` injected at construction.

Answers in :class:`Sample` are *canonical keys*: the engine has already extracted and normalised
them (two equivalent answers carry the same key), so allocators compare answers with ``==``.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict


@dataclass(frozen=True, slots=True)
class Sample:
    """One drawn sample as the allocator sees it.

    ``answer`` is the canonical answer key (``None``: nothing could be extracted, or the sample was
    truncated), ``score`` the verifier score in [0, 1] when the policy has a verifier, ``tokens`` the
    completion tokens spent on it, ``logprob`` the mean token log-probability when the backend
    reported it, ``truncated`` whether it stopped at its token limit or was cut (such a sample never
    votes), ``confidence`` its lowest sliding-window group confidence when the allocator monitors
    traces (:meth:`Allocator.trace_monitor`; see :mod:`allocators.deepconf`).
    """

    answer: str | None
    score: float | None = None
    tokens: int = 0
    logprob: float | None = None
    truncated: bool = False
    confidence: float | None = None


@dataclass(slots=True)
class QueryState:
    """Everything known about one query between rounds.

    ``cap`` is the per-query maximum number of samples (the engine never draws past it);
    ``features`` are cheap numeric prompt features (length, digits, ...) for difficulty models;
    ``prior_difficulty`` is an estimate in [0, 1] of the single-sample failure rate, if any;
    ``in_flight`` the samples started and not finished yet (stream schedule; ``samples`` holds only
    finished ones).
    """

    id: str
    cap: int
    features: Mapping[str, float] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    prior_difficulty: float | None = None
    in_flight: int = 0

    @property
    def spent(self) -> int:
        """Samples finished so far."""
        return len(self.samples)

    @property
    def tokens_spent(self) -> int:
        return sum(s.tokens for s in self.samples)

    @property
    def room(self) -> int:
        """Samples this query may still receive under its cap (the in-flight ones among them)."""
        return max(0, self.cap - len(self.samples))

    def votes(self) -> Counter[str]:
        """Vote count per canonical answer (samples without an answer do not vote)."""
        return Counter(s.answer for s in self.samples if s.answer is not None)

    def top_two(self) -> tuple[int, int]:
        """Counts of the most and second most voted answers (0 where absent)."""
        common = self.votes().most_common(2)
        a = common[0][1] if common else 0
        b = common[1][1] if len(common) > 1 else 0
        return a, b


@dataclass(frozen=True, slots=True)
class Budget:
    """What is left to spend for the whole set of queries in this run.

    ``samples``: samples left (``None``: no shared sample budget, only per-query caps).
    ``tokens``: completion tokens left (``None``: not token-billed). The engine enforces both hard
    (it shrinks ``max_tokens`` of the last draws so tokens are never overspent); the allocator
    plans against them so that the plan itself never asks for more samples than ``samples``.
    """

    samples: int | None = None
    tokens: int | None = None


Plan = dict[str, int]


class AllocatorParams(BaseModel):
    """Base for every allocator's params: validated, frozen, unknown fields rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)


class Allocator:
    """Base class of every allocator.

    Subclasses set ``name`` and ``Params`` and implement :meth:`plan`. State (learned statistics)
    lives in the allocator object, never in the params. An allocator object serves one run (one
    request or one batch) unless it declares ``shared = True``, in which case the service keeps one
    instance per policy version and feeds it finished queries through :meth:`learn`; such an
    allocator exports that state with :meth:`state_dict` and takes it back with
    :meth:`load_state_dict` (how replicas share it).
    """

    name: ClassVar[str] = ""
    Params: ClassVar[type[AllocatorParams]] = AllocatorParams
    shared: ClassVar[bool] = False
    uses_features: ClassVar[bool] = False
    """Whether :meth:`plan` reads ``QueryState.features`` (the engine computes them only then)."""

    def __init__(self, params: AllocatorParams, rng: random.Random) -> None:
        self.params = params
        self.rng = rng

    def plan(self, states: Sequence[QueryState], budget: Budget) -> Plan:
        """Return how many more samples each query gets this round; ``{}`` ends the run.

        Must never return more than ``state.room`` for a query nor, summed, more than
        ``budget.samples`` when that is set. Queries absent from the plan get nothing this round.
        In-flight samples count in a query's planned number (see the module doc) and in
        ``budget.samples``.
        """
        raise NotImplementedError

    @property
    def own_cap(self) -> int | None:
        """The most samples this allocator ever draws for one query, when its params bound it
        (``max_samples``, else ``n``); ``None``: only the request's cap bounds it."""
        own = getattr(self.params, "max_samples", None) or getattr(self.params, "n", None)
        return own if isinstance(own, int) else None

    def trace_monitor(self) -> tuple[int, int] | None:
        """``(window, top_k)`` when the allocator wants each trace's confidence measured from streamed
        top-k log-probs (``Sample.confidence``) and may cut running traces (:meth:`cut_below`)."""
        return None

    def cut_below(self, state: QueryState) -> float | None:
        """A running trace of ``state`` whose group confidence falls below this is cut (``None``: none)."""
        return None

    def stop_reason(self, state: QueryState) -> str:
        """Why this allocator wants no more samples for ``state`` (asked once it stopped planning it):
        ``cap`` (its own sample cap), ``no_answer`` or ``no_agreement`` (it gave up), else ``policy``
        (its rule is satisfied). Default: ``cap`` at :attr:`own_cap`, else ``policy``."""
        own = self.own_cap
        return "cap" if own is not None and state.spent >= own else "policy"

    def finished(self, state: QueryState) -> bool:
        """Whether ``state`` needs no more samples whatever its in-flight ones would say (stream
        schedule: they are cancelled). Decided on the query's finished samples alone: the engine asks
        when a sample of the query has finished. Default ``False``: in-flight samples always finish."""
        return False

    def learn(self, finished: Sequence[QueryState]) -> None:
        """Update cross-request statistics from finished queries (default: nothing)."""
        return None

    def state_dict(self) -> dict[str, Any]:
        """The state :meth:`learn` changes, as plain JSON values (``json.dumps`` round-trips it exactly).

        Contract: for allocators ``a`` and ``b`` built with the same params,
        ``b.load_state_dict(a.state_dict())`` followed by the same :meth:`learn` calls on both leaves
        ``a.state_dict() == b.state_dict()`` bit for bit, and their plans equal (whatever RNG the
        state depends on is part of it). Default ``{}``: the allocator keeps no such state.
        """
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Replace the learned state with ``state`` (from :meth:`state_dict` of an allocator with the
        same params; see its contract). Raises ``ValueError`` when ``state`` does not fit; the
        default accepts only ``{}``."""
        if state:
            raise ValueError(f"allocator {self.name!r} keeps no state; got keys {sorted(state)}")
