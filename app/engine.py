"""The engine loop: one code path for single requests, batches and offline replay.

The loop launches backend calls, waits for the next to finish, and asks the allocator again:

1. ``plan = allocator.plan(states, Budget(samples_left, tokens_left))``. ``plan[q]`` is how many
   more samples query ``q`` needs beyond its finished ones, the ones in flight included
   (``QueryState.in_flight``): the engine starts ``plan[q] - in_flight`` new ones, never past the
   query's cap, the shared sample budget (samples started count, finished or not) or, in stream mode,
   the schedule's ``width`` per query and the engine's ``max_in_flight`` per run. With a token
   budget every started sample gets ``max_tokens`` such that what all in-flight samples may still
   generate (plus the verifier's reserve) fits in what is left: tokens are never overspent.
2. **rounds** (``Schedule.mode``): each planned query gets one ``n=k`` call (shared prompt prefix)
   and the loop waits for every call of the round before planning again (a barrier).
   **stream**: the new samples of a query are one streamed ``n=k`` call (one prefill, as in rounds),
   each sample delivered the moment its choice finishes; the allocator is asked again at every
   delivery (so more samples start while others still run), and a query it calls
   :meth:`~allocators.Allocator.finished` has its in-flight calls cancelled (their streams closed,
   the tokens they had generated counted in usage and in the token budget).
3. A finished call's samples are scored by the verifier and keyed by the policy's answer kind
   (:mod:`app.answers`; CPU-heavy keys in worker processes, never on the event loop); a sample that
   stopped at its token limit (``finish_reason: length``) is kept but does not vote.

The loop ends when nothing is in flight and nothing more is planned (or a budget is spent); the
aggregator then selects one sample per query. A deadline cancels everything in flight and either
raises :class:`DeadlineExceeded` or, when the caller allows partial results, returns what finished.
Sources that answer without I/O (replay) run on a simulated clock of token steps
(:mod:`app.flights`), so replay reports the latency and tokens of either schedule.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import httpx

from allocators import Budget, QueryState, Sample
from app.aggregators import Candidate, Selection
from app.answers import AnswerRuntime, QueryCanon, build_kind
from app.backends.base import Draw, SampleSource, SamplingRequest, Usage
from app.confidence import TraceMonitor, token_top_logprobs, trace_confidence
from app.errors import BackendError, DeadlineExceeded
from app.flights import DONE, Flight, LiveFlights, SimulatedFlights
from app.policy import PolicyParts
from app.runs import (
    Drawn,
    Fetched,
    Query,
    QueryRun,
    Resume,
    RoundCallback,
    RoundEvent,
    RunLimits,
    RunResult,
    derive_seed,
    prompt_features,
)
from app.verifiers import VerifierError, VerifyContext

__all__ = ["Drawn", "Engine", "Query", "QueryRun", "Resume", "RoundCallback", "RoundEvent", "RunLimits", "RunResult",
           "derive_seed", "describe_samples", "prompt_features"]

@dataclass(slots=True)
class _Tally:
    """The run's spend: samples started, tokens charged (finished and cancelled samples, verifier
    calls) and tokens held for samples in flight."""

    started: int = 0
    tokens: int = 0
    reserved: int = 0
    drawn: int = 0
    cancelled: int = 0
    usage: Usage = field(default_factory=Usage)


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
                 max_in_flight: int = 64, capacity: int | None = None, gauges: tuple[Any, Any] | None = None) -> None:
        self.source = source
        self.http = http
        self.default_max_tokens = default_max_tokens
        self.answers = answers
        self.max_in_flight = max_in_flight
        self.capacity = capacity
        self.gauges = gauges
        self.streaming = 0
        """Streamed samples in flight over every run."""

    def width(self, width: int) -> int:
        """The load-aware width (see the class doc)."""
        if self.capacity is None:
            return width
        return max(1, math.ceil(width * (1 - min(1.0, self.streaming / self.capacity))))

    def _streaming(self, delta: int) -> None:
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
        on_text: Callable[[str], None] | None = None,
        resume: Resume | None = None,
    ) -> RunResult:
        """Run ``queries`` under ``parts`` within ``limits`` (see the module doc). ``on_text`` (stream
        schedule, one query of one sample): each piece of the sample's text as it arrives. ``resume``:
        continue a run from its checkpoint (its samples join their queries first, in order, and count
        in every budget)."""
        runs = []
        features = parts.allocator.uses_features
        for q in queries:
            prompt = q.request.prompt_text()
            state = QueryState(id=q.id, cap=q.cap, features=prompt_features(prompt) if features else {},
                               prior_difficulty=q.prior_difficulty)
            canon = QueryCanon(build_kind(parts.answer, prompt), self.answers, q.known_keys)
            runs.append(QueryRun(q, state, canon))
        by_id = {r.query.id: r for r in runs}
        tally = _Tally()
        flights: LiveFlights[Fetched] | SimulatedFlights[Fetched] = (
            SimulatedFlights() if self.source.inline else LiveFlights())
        rounds = 0
        if resume is not None:
            rounds = await self._restore(by_id, resume, tally)
        stop_reason = ""
        stream = parts.schedule.mode == "stream"
        monitor = parts.allocator.trace_monitor()
        try:
            while True:
                if limits.deadline is not None and not self.source.inline and flights.now >= limits.deadline:
                    stop_reason = "deadline"
                    break
                if stream or not len(flights):
                    reason = await self._launch(runs, by_id, parts, limits, tally, flights, seed, rounds + 1, on_text)
                    if reason is None:
                        rounds += 1
                    elif not len(flights):
                        stop_reason = reason
                        break
                done = await flights.wait(None if self.source.inline else limits.deadline)
                if not done:
                    stop_reason = "deadline"
                    break
                touched: set[str] = set()
                for flight, item in done:
                    if isinstance(item, BaseException):
                        raise item
                    if item is DONE:
                        self._release(flight, tally, stream)
                    else:
                        assert isinstance(item, Fetched)
                        run = by_id[flight.run_id]
                        self._absorb(run, flight, item, tally, stream, monitor)
                        touched.add(run.query.id)
                        if self.source.inline:
                            run.steps = flights.now if stream else run.steps + _steps(item)
                if stream and touched:  # a query is finished (or not) on its finished samples alone
                    over = [f for f in flights.flights()
                            if f.run_id in touched and parts.allocator.finished(by_id[f.run_id].state)]
                    if over:
                        await self._cancel(flights, over, by_id, tally, stream)
                if on_round is not None and (stream or not len(flights)):
                    await on_round(RoundEvent(rounds, tally.drawn, runs, tally.cancelled, tally.usage))
        finally:
            if len(flights):
                await self._cancel(flights, flights.flights(), by_id, tally, stream)
        partial = False
        if stop_reason == "deadline":
            if tally.drawn == 0 or not limits.partial_on_deadline:
                raise DeadlineExceeded(
                    f"Deadline passed after {rounds} round(s) and {tally.drawn} sample(s).",
                    param="ttc.budget.deadline_ms",
                )
            partial = True
        for run in runs:
            run.selection = _select(run, parts) if run.draws else None
        return RunResult(runs, rounds, stop_reason, tally.usage, tally.drawn, partial, tally.cancelled)

    async def _launch(self, runs: list[QueryRun], by_id: dict[str, QueryRun], parts: PolicyParts,
                      limits: RunLimits, tally: _Tally, flights: LiveFlights[Fetched] | SimulatedFlights[Fetched],
                      seed: int | None, round_index: int, on_text: Callable[[str], None] | None) -> str | None:
        """Ask the allocator and start what it planned; the stop reason when nothing was started."""
        reserve = parts.verifier.reserve_tokens if parts.verifier is not None else 0
        if limits.samples is not None and tally.started >= limits.samples:
            return "budget"
        tokens_free = None if limits.tokens is None else limits.tokens - tally.tokens - tally.reserved
        if tokens_free is not None and tokens_free < 1 + reserve:
            return "tokens"
        flying: dict[str, int] = {}
        for f in flights.flights():
            flying[f.run_id] = flying.get(f.run_id, 0) + f.pending
        states = [r.state for r in runs]
        for st in states:
            st.in_flight = flying.get(st.id, 0)
        in_flight = sum(flying.values())
        budget = Budget(None if limits.samples is None else limits.samples - tally.started + in_flight,
                        None if limits.tokens is None else limits.tokens - tally.tokens)
        stream = parts.schedule.mode == "stream"
        width = self.width(parts.schedule.width) if stream else 0
        if stream and self.gauges is not None:
            self.gauges[0].set(width)
        wanted = parts.allocator.plan(states, budget)
        plan: dict[str, int] = {}
        for qid, k in wanted.items():
            run = by_id.get(qid)
            if run is None:
                continue
            target = min(int(k), run.state.room)
            if stream:
                target = min(target, width)
            if target - run.state.in_flight > 0:
                plan[qid] = target - run.state.in_flight
        samples_left = None if limits.samples is None else limits.samples - tally.started
        plan = _clamp(plan, samples_left, self.max_in_flight - in_flight if stream else None)
        if not plan:
            return "cap" if all(s.room == 0 for s in states) else "policy"
        per_sample_max = None
        if tokens_free is not None:
            plan = _fit_tokens(plan, tokens_free, reserve)
            if not plan:
                return "tokens"
            per_sample_max = (tokens_free - sum(plan.values()) * reserve) // sum(plan.values())
        monitor = parts.allocator.trace_monitor()
        for qid, k in plan.items():
            run = by_id[qid]
            req = _with_logprobs(run.query.request, parts, monitor)
            limit = int(req.params.get("max_tokens") or self.default_max_tokens)
            max_tokens = None if per_sample_max is None else min(per_sample_max, limit)
            held = 0 if tokens_free is None else (max_tokens or limit) + reserve
            run.rounds += 1
            # a monitored trace may be cut alone: its own call
            sizes = [1] * k if stream and monitor is not None else [k]
            for n in sizes:
                salt = f"s{run.started}" if stream else round_index
                call_seed = None if seed is None else derive_seed(seed, qid, salt)
                flight = Flight(qid, n, held, flights.now, round_index)
                if stream and monitor is not None:
                    cut_below = partial(parts.allocator.cut_below, run.state)
                    flight.progress.watch = _watcher(TraceMonitor(*monitor, cut_below), req.kind)
                if stream and n == 1:
                    flight.progress.on_text = on_text
                tally.started += n
                tally.reserved += held * n
                run.started += n
                if stream:
                    self._streaming(n)
                await flights.launch(flight, self._produce(run, req, n, call_seed, max_tokens, parts, flight), _steps)
        return None

    async def _produce(self, run: QueryRun, req: SamplingRequest, n: int, seed: int | None,
                       max_tokens: int | None, parts: PolicyParts, flight: Flight) -> AsyncIterator[Fetched]:
        """One call's deliveries, scored and keyed; changes no state. Rounds: one ``n=k`` call, its
        samples delivered together. Stream: one streamed ``n=k`` call, each sample delivered as it
        finishes, then the call's remaining usage."""
        if parts.schedule.mode == "stream":
            async for item in self.source.stream(req, n, flight.progress, seed=seed, max_tokens=max_tokens):
                if isinstance(item, Usage):
                    yield Fetched([], [], [], [], item)
                else:
                    yield await self._score(run, req, [item], Usage(0, item.tokens), parts)
        else:
            result = await self.source.draw(req, n, seed=seed, max_tokens=max_tokens)
            yield await self._score(run, req, result.draws, result.usage, parts)

    async def _score(self, run: QueryRun, req: SamplingRequest, draws: list[Draw], usage: Usage,
                     parts: PolicyParts) -> Fetched:
        """The verifier's scores and the answer keys of finished samples."""
        usage = Usage(usage.prompt_tokens, usage.completion_tokens)
        scores: list[float | None] = [None] * len(draws)
        if parts.verifier is not None and draws:
            ctx = VerifyContext(request=req, reference=run.query.reference, generator=self.source, http=self.http,
                                tests=run.query.tests, code=self.answers.code if self.answers else None,
                                canon=run.canon)
            try:
                verdict = await parts.verifier.score(ctx, draws)
            except VerifierError as exc:
                raise BackendError(f"Verifier {parts.verifier.name!r} failed: {exc}",
                                   code="verifier_failed") from exc
            scores = list(verdict.scores)
            usage.add(verdict.usage)
        raws = [d.answer if d.answer is not None else run.canon.extract(d.text, d.tool_calls) for d in draws]
        keys = await run.canon.keys(raws)
        return Fetched(draws, raws, keys, scores, usage)

    async def _restore(self, by_id: dict[str, QueryRun], resume: Resume, tally: _Tally) -> int:
        """A checkpoint's samples join their queries (keyed again, in order); its spend is billed.
        Returns the rounds it had run."""
        for qid, drawn in resume.samples.items():
            run = by_id[qid]
            keys = await run.canon.keys([d.raw for d in drawn])
            for d, key in zip(drawn, keys, strict=True):
                _add_sample(run, d.draw, d.raw, key, d.score, d.confidence, d.round)
            run.started += len(drawn)
            tally.drawn += len(drawn)
        tally.started = tally.drawn + resume.cancelled
        tally.cancelled = resume.cancelled
        tally.usage.add(resume.usage)
        tally.tokens = resume.usage.completion_tokens
        return resume.rounds

    def _absorb(self, run: QueryRun, flight: Flight, fetched: Fetched, tally: _Tally, stream: bool,
                monitor: tuple[int, int] | None) -> None:
        """Finished samples join their query's state; their cost is billed, their reserve released."""
        for draw, raw, key, score in zip(fetched.draws, fetched.raws, fetched.keys, fetched.scores, strict=True):
            confidence = None
            if monitor is not None:
                confidence = trace_confidence(draw.logprobs, run.query.request.kind, *monitor)
            _add_sample(run, draw, raw, key, score, confidence, flight.round)
        k = min(len(fetched.draws), flight.pending)
        run.usage.add(fetched.usage)
        tally.usage.add(fetched.usage)
        tally.tokens += fetched.usage.completion_tokens
        tally.drawn += len(fetched.draws)
        flight.delivered += k
        tally.reserved -= k * flight.reserve
        if stream:
            self._streaming(-k)

    def _release(self, flight: Flight, tally: _Tally, stream: bool) -> None:
        """A call ended: samples it was asked for and did not deliver are not spent."""
        tally.started -= flight.pending
        tally.reserved -= flight.pending * flight.reserve
        if stream:
            self._streaming(-flight.pending)
        flight.delivered = flight.n

    async def _cancel(self, flights: LiveFlights[Fetched] | SimulatedFlights[Fetched], doomed: list[Flight],
                      by_id: dict[str, QueryRun], tally: _Tally, stream: bool) -> None:
        """Cancel calls (closing their streams) and bill what they had generated: the tokens of their
        unfinished samples, and of samples that finished but were not taken before the cancel."""
        stale = await flights.cancel(doomed)
        late: dict[int, int] = {}
        for flight, item in stale:
            if isinstance(item, Fetched):
                late[id(flight)] = late.get(id(flight), 0) + item.usage.completion_tokens
        for flight in doomed:
            run = by_id[flight.run_id]
            spent = Usage(0, flight.progress.tokens + late.get(id(flight), 0))
            run.usage.add(spent)
            tally.usage.add(spent)
            tally.tokens += spent.completion_tokens
            tally.reserved -= flight.pending * flight.reserve
            tally.cancelled += flight.pending
            run.cancelled += flight.pending
            run.cancelled_tokens += spent.completion_tokens
            if stream:
                self._streaming(-flight.pending)
            flight.delivered = flight.n


def _add_sample(run: QueryRun, draw: Draw, raw: str | None, key: str | None, score: float | None,
                confidence: float | None, round_index: int) -> None:
    """A finished sample joins its query. One at its token limit or cut by a trace monitor does not vote."""
    truncated = draw.finish_reason in ("length", "cut")
    run.sample_rounds.append(round_index)
    run.draws.append(draw)
    run.raws.append(raw)
    run.keys.append(key)
    run.state.samples.append(Sample(answer=None if truncated else key, score=score, tokens=draw.tokens,
                                    logprob=draw.logprob, truncated=truncated, confidence=confidence))


def _with_logprobs(req: SamplingRequest, parts: PolicyParts, monitor: tuple[int, int] | None) -> SamplingRequest:
    """The request as sent: with log-probs when the verifier needs them, and the top ``k``
    alternatives per token when the allocator monitors traces."""
    params = req.params
    if parts.verifier is not None and parts.verifier.needs_logprobs and not params.get("logprobs"):
        params = {**params, "logprobs": True}
    if monitor is not None:
        top = monitor[1]
        params = {**params, **({"logprobs": True, "top_logprobs": top} if req.kind == "chat" else {"logprobs": top})}
    return req if params is req.params else replace(req, params=params)


def _watcher(monitor: TraceMonitor, kind: str) -> Callable[[Any], bool]:
    """A stream watcher feeding each chunk's tokens to ``monitor``; ``True`` once it asks to cut."""
    def watch(logprobs: Any) -> bool:
        cut = False
        for top in token_top_logprobs(logprobs, kind):
            cut = monitor(top) or cut
        return cut

    return watch


def _steps(fetched: Fetched) -> int:
    """A delivery's time in token steps: its longest sample (0 for a call's closing usage)."""
    return max((d.tokens for d in fetched.draws), default=0)


def _clamp(plan: dict[str, int], samples_left: int | None, slots: int | None) -> dict[str, int]:
    """Defend the budget whatever the allocator returned: the shared sample budget, then the run's
    free in-flight slots, taken in plan order (the allocator's priority)."""
    out: dict[str, int] = {}
    left = samples_left if slots is None else slots if samples_left is None else min(samples_left, slots)
    for qid, k in plan.items():
        if left is not None:
            k = min(k, left)
            left -= max(k, 0)
        if k > 0:
            out[qid] = k
    return out


def _fit_tokens(plan: dict[str, int], tokens_left: int, reserve: int) -> dict[str, int]:
    """Drop samples from the end of the plan until every sample can get >= 1 token (+ reserve)."""
    total = sum(plan.values())
    excess = total - tokens_left // (1 + reserve)
    if excess <= 0:
        return plan
    out = dict(plan)
    for qid in reversed(list(out)):
        take = min(out[qid], excess)
        out[qid] -= take
        excess -= take
        if out[qid] == 0:
            del out[qid]
        if excess == 0:
            break
    return out


def _select(run: QueryRun, parts: PolicyParts) -> Selection:
    candidates = [
        Candidate(index=i, text=d.text, answer=key, score=s.score, logprob=s.logprob, truncated=s.truncated)
        for i, (d, s, key) in enumerate(zip(run.draws, run.state.samples, run.keys, strict=True))
    ]
    return parts.aggregator.select(candidates)


def describe_samples(run: QueryRun) -> list[dict[str, Any]]:
    """Per-sample details for ``return_samples`` (``round``: the round, or in the stream schedule the
    launch wave, that started the sample)."""
    return [
        {"index": i, "text": d.text, "answer": key, "score": s.score, "tokens": s.tokens,
         "logprob": s.logprob, "finish_reason": d.finish_reason, "truncated": s.truncated,
         "confidence": s.confidence, "round": r}
        for i, (d, s, key, r) in enumerate(zip(run.draws, run.state.samples, run.keys, run.sample_rounds,
                                                strict=True))
    ]
