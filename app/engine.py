"""The engine: one run path for single requests, batches and offline replay, whatever the strategy.

:meth:`Engine.run` builds the run's state (:class:`~app.run.Run`: the queries' records, the spend, the
calls in flight), hands it to the policy's **strategy** (:meth:`Engine.strategy_for`: how samples
grow; today :class:`~app.sampling.ParallelSampling`, which draws whole samples and asks the allocator
how many more) and, whatever happened, closes it (calls still in flight cancelled and billed, every
count it held released); then the aggregator selects one sample per query. :mod:`app.run` says what
every strategy shares (budgets, billing, scoring, the clock).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import httpx
from cachetools import LRUCache

from app.answers import AnswerRuntime
from app.backends.base import SampleSource
from app.errors import BackendUnavailable
from app.optimal import OPTIMAL
from app.policy import PolicyParts
from app.run import (
    Drawn,
    Query,
    QueryRun,
    Resume,
    RoundCallback,
    RoundEvent,
    Run,
    RunLimits,
    RunResult,
    derive_seed,
    describe_samples,
    needed,
    prompt_features,
)
from app.sampling import SAMPLING
from app.search import SEARCHES

__all__ = ["Drawn", "Engine", "Query", "QueryRun", "Resume", "RoundCallback", "RoundEvent", "RunLimits", "RunResult",
           "derive_seed", "describe_samples", "prompt_features"]


class Strategy(Protocol):
    """How a run's samples grow (the seam where parallel sampling and step-level search plug in).

    :meth:`run` drives a :class:`~app.run.Run` until its queries are done and returns the stop reason
    (``policy``, ``cap``, ``budget``, ``tokens``, ``deadline``, ...). It launches backend calls only
    through :meth:`Run.launch` and consumes them through :meth:`Run.wait` / :meth:`Run.take`, so
    budgets, billing, scoring, cancellation and the clock are the engine's, not the strategy's; it may
    leave calls in flight when it returns (the engine cancels and bills them)."""

    async def run(self, run: Run) -> str: ...


class Engine:
    """Runs policies against a sample source; holds no state of a run, so one engine serves every
    request. ``max_in_flight``: most samples of one run in flight at once (stream schedule).

    **Load-aware width** (stream schedule): with ``capacity`` ``C`` (streamed samples the backends
    take at once) and ``L`` streamed samples in flight over every run of this engine, a query is
    granted ``w = max(1, ceil(width * (1 - min(1, L / C))))`` samples in flight: the full width
    when idle, narrowing as the backends fill, one sample (no speculation) at capacity, and wide
    again as load drains. ``gauges`` (optional, ``.set()``-able) report ``w`` and ``L``.
    """

    def __init__(self, source: SampleSource, http: httpx.AsyncClient | None = None,
                 default_max_tokens: int = 256, answers: AnswerRuntime | None = None,
                 max_in_flight: int = 64, capacity: int | None = None, gauges: tuple[Any, Any] | None = None,
                 endpoints: Mapping[str, str] | None = None) -> None:
        self.source = source
        self.endpoints: Mapping[str, str] = endpoints or {}
        """Named URLs verifiers reach as ``embedded:NAME`` (the embedded PRM, ...)."""
        self.http = http
        self.default_max_tokens = default_max_tokens
        self.answers = answers
        self.max_in_flight = max_in_flight
        self.capacity = capacity
        self.gauges = gauges
        self.streaming = 0
        """Streamed samples in flight over every run."""
        self._needs: LRUCache[str, dict[int, float]] = LRUCache(4096)
        """Per policy (:func:`~app.run.speculation_key`): how often its queries needed each number of
        samples, recent queries weighing most (see :meth:`learn_need`)."""

    def speculation(self, key: str, spent: int) -> int:
        """How many samples a query of this policy that has ``spent`` finished samples and is not decided
        yet should have started (finished or in flight) before the allocator is asked again:
        ``spent + ceil(idle * (m - spent))``, where ``m`` is the median of ``need`` given ``need >
        spent`` and ``need`` the number of samples the policy's queries needed (their recent distribution,
        :meth:`learn_need`). A query still undecided is one of the harder ones: after two samples of a
        policy whose queries need 1-2 or about 10, it starts about eight more at once instead of one
        small wave after another, while a fresh query starts what half of the queries needed. (The
        median, not the mean: the samples of one wave decode side by side and finish together, so each
        one started beyond what the query needs is a whole sample of tokens.) ``idle`` is ``1 - busy``,
        the larger of the backends' own load (vLLM's /metrics) and this engine's streamed in-flight share
        of its capacity: idle backends get the wave at once, saturated ones nothing beyond what the
        allocator asks for. 0 before the policy's first query, and for a query past every need seen."""
        seen = self._needs.get(key)
        if not seen:
            return 0
        above = sorted((n, w) for n, w in seen.items() if n > spent)
        half = sum(w for _, w in above) / 2
        if half <= 0:
            return 0
        acc, median = 0.0, above[-1][0]
        for n, w in above:
            acc += w
            if acc >= half - 1e-9:
                median = n
                break
        own = 0.0 if self.capacity is None else min(1.0, self.streaming / self.capacity)
        idle = 1.0 - max(own, self.source.busy())
        return spent + math.ceil((median - spent) * idle - 1e-9) if idle > 0 else 0

    def learn_need(self, key: str, samples: int) -> None:
        """Count one query's needed samples in its policy's distribution; older counts decay by 0.98 a
        query (the last hundred or so queries dominate it)."""
        seen = self._needs.get(key)
        if seen is None:
            seen = self._needs[key] = {}
        for n in list(seen):
            seen[n] *= 0.98
            if seen[n] < 1e-3:
                del seen[n]
        seen[samples] = seen.get(samples, 0.0) + 1.0

    def strategy_for(self, parts: PolicyParts) -> Strategy:
        """The strategy that runs a policy's samples: compute-optimal when the policy has an ``optimal``
        spec (:mod:`app.optimal`), step-level search when it has a ``search`` spec (:mod:`app.search`),
        else parallel sampling (:mod:`app.sampling`)."""
        if parts.optimal is not None:
            return OPTIMAL
        return SEARCHES[parts.search.method] if parts.search is not None else SAMPLING

    def width(self, width: int) -> int:
        """The load-aware width (see the class doc); reported on its gauge."""
        w = width if self.capacity is None else max(
            1, math.ceil(width * (1 - min(1.0, self.streaming / self.capacity))))
        if self.gauges is not None:
            self.gauges[0].set(w)
        return w

    def count_streaming(self, delta: int) -> None:
        self.streaming += delta
        if self.gauges is not None:
            self.gauges[1].set(self.streaming)

    async def run(
        self,
        queries: Sequence[Query],
        parts: PolicyParts,
        limits: RunLimits,
        *,
        seed: int | None = None,
        on_round: RoundCallback | None = None,
        on_text: Callable[[str, bool], None] | None = None,
        resume: Resume | None = None,
        owner: str | None = None,
    ) -> RunResult:
        """Run ``queries`` under ``parts`` within ``limits`` (see the module doc). ``on_round``: called
        after each round (stream schedule: each batch of deliveries); ``on_text`` (one query of one
        streamed sample): each piece of the sample's text as it arrives. ``resume``: continue a run
        from its checkpoint (its samples join their queries first, in order, and count in every
        budget). ``owner``: the API key the run is for (sandbox turns). A policy that monitors traces
        is refused (:class:`BackendUnavailable`, ``monitor_unavailable``) when no backend can cut them
        inside its engine."""
        if parts.allocator.trace_monitor() is not None:
            for model in {q.request.model for q in queries}:
                why = self.source.why_not_cutting(model)
                if why is not None:
                    raise BackendUnavailable(why, code="monitor_unavailable")
        run = Run(self, queries, parts, limits, seed, on_round, on_text, owner)
        try:
            if resume is not None:
                await run.restore(resume)
            stop_reason = await self.strategy_for(parts).run(run)
            await run.finish_probes()
        finally:
            await run.close()
        if run.spec_key is not None and len(run.runs) == 1 and run.runs[0].state.samples:
            self.learn_need(run.spec_key, needed(parts.allocator, run.runs[0].state))
        return run.result(stop_reason)
