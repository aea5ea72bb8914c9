"""One run: :class:`Run` is the state of one run and the operations every :class:`~app.engine.Strategy`
shares, so budgets are counted in one place whatever the strategy:

* **budgets**: a call is launched (:meth:`Run.launch`) holding ``max_tokens`` (+ the verifier's
  reserve) per sample in the token budget, and one slot per sample in the sample budget; a delivery
  (:meth:`Run.take`) bills what it cost and frees what it held; a cancelled call (:meth:`Run.cancel`)
  bills the tokens its samples had generated. Tokens are therefore never overspent: what all
  in-flight samples may still generate always fits in what is left.
* **scoring**: a finished call's samples are scored by the verifier and keyed by the policy's answer
  kind (:mod:`app.answers`; CPU-heavy keys in worker processes, never on the event loop); a sample that
  stopped at its token limit (``finish_reason: length``) or was cut is kept but does not vote.
* **the clock**: live calls on the event loop (:class:`~app.flights.LiveFlights`); sources that answer
  without I/O (replay) on a simulated clock of token steps (:class:`~app.flights.SimulatedFlights`),
  so replay reports the latency and tokens of a strategy through the same code.
* **the end**: :meth:`Run.close` cancels and bills what is still in flight and releases every count
  the run holds, whatever ended it; :meth:`Run.result` selects one sample per query.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Protocol

import httpx

from allocators import QueryState, Sample
from app.answers import AnswerRuntime, QueryCanon
from app.backends.base import Draw, SampleSource, SamplingRequest, TraceCut, Usage
from app.confidence import trace_confidence
from app.errors import BackendError, DeadlineExceeded
from app.flights import DONE, Flight, LiveFlights, SimulatedFlights
from app.policy import PolicyParts
from app.probes import PROBE_DROPS, THINK_END, ProbeReading, TraceProbe
from app.query import (
    Drawn,
    Fetched,
    Query,
    QueryRun,
    Resume,
    RoundCallback,
    RoundEvent,
    RunLimits,
    RunResult,
    add_sample,
    derive_seed,
    describe_samples,
    needed,
    prompt_features,
    speculation_key,
)
from app.verifiers import PRMVerifier, VerifierError, VerifyContext

__all__ = ["Drawn", "Fetched", "Query", "QueryRun", "Resources", "Resume", "RoundCallback", "RoundEvent", "Run",
           "RunLimits", "RunResult", "add_sample", "derive_seed", "describe_samples", "needed",
           "prompt_features", "speculation_key"]

_log = logging.getLogger("ttc.request")


class Resources(Protocol):
    """What a run uses of the engine that runs it (:class:`app.engine.Engine`): the sample source and
    the verifiers' and answer keys' helpers, the per-sample token default, the in-flight limit, the
    service-wide streamed in-flight count with its load-aware width, and what speculation reads (how
    idle the backends are, how many samples a policy's queries usually need)."""

    source: SampleSource
    http: httpx.AsyncClient | None
    answers: AnswerRuntime | None
    default_max_tokens: int
    max_in_flight: int
    endpoints: Mapping[str, str]

    def width(self, width: int) -> int: ...

    def count_streaming(self, delta: int) -> None: ...

    def speculation(self, key: str, spent: int) -> int: ...


class Run:
    """The state of one run and the operations every strategy shares (see the module doc).

    ``runs``/``by_id``: each query's record; ``started`` (samples started: finished, cancelled or in
    flight), ``tokens`` (completion tokens billed), ``reserved`` (tokens held by samples in flight),
    ``drawn`` (finished samples), ``cancelled``, ``usage`` (everything billed, prompts included);
    ``rounds``: launch waves so far; ``monitor``: the allocator's trace monitor ``(window, top_k)``,
    if any; ``held``: streamed samples this run counts in the engine's in-flight total."""

    def __init__(self, engine: Resources, queries: Sequence[Query], parts: PolicyParts, limits: RunLimits,
                 seed: int | None, on_round: RoundCallback | None, on_text: Callable[[str, bool], None] | None,
                 owner: str | None = None) -> None:
        self.engine = engine
        self.owner = owner
        """The API key the run is for (its programs take that key's turns in the sandbox)."""
        self.parts = parts
        self.limits = limits
        self.seed = seed
        self.on_round = on_round
        self.on_text = on_text
        self.inline = engine.source.inline
        self.stream = parts.schedule.mode == "stream"
        self.spec_key = speculation_key(parts) if self.stream and parts.schedule.speculate else None
        """The policy's key for speculation (``None``: this run never starts more than it is asked)."""
        self.monitor = parts.allocator.trace_monitor()
        self.logprobs = parts.verifier is not None and parts.verifier.needs_logprobs
        """Every call asks for token log-probs: the verifier scores by them (whether or not the client asked)."""
        self.solo = self.stream and parts.probe is not None
        """Every sample is a streamed call of its own (a trace may be stopped by its probes alone)."""
        self.probes: dict[str, list[TraceProbe]] = {}
        """The probes of each query's traces (:mod:`app.probes`)."""
        self.reserve = parts.verifier.reserve_tokens if parts.verifier is not None else 0
        features = parts.allocator.uses_features
        self.runs: list[QueryRun] = []
        for q in queries:
            prompt = q.request.prompt_text()
            state = QueryState(id=q.id, cap=q.cap, features=prompt_features(prompt) if features else {},
                               prior_difficulty=q.prior_difficulty)
            canon = QueryCanon(parts.kind(prompt), engine.answers, q.known_keys, owner=owner)
            self.runs.append(QueryRun(q, state, canon))
        self.by_id = {r.query.id: r for r in self.runs}
        self.flights: LiveFlights[Fetched] | SimulatedFlights[Fetched] = (
            SimulatedFlights() if self.inline else LiveFlights())
        self.started = self.tokens = self.reserved = self.drawn = self.cancelled = 0
        self.usage = Usage()
        self.rounds = 0
        self.held = 0

    # -- what is left ------------------------------------------------------------------------------

    def deadline_passed(self) -> bool:
        """The wall-clock deadline passed (never for an I/O-free source: replay has none)."""
        d = self.limits.deadline
        return d is not None and not self.inline and self.flights.now >= d

    def tokens_free(self) -> int | None:
        """Tokens neither billed nor held by samples in flight (``None``: no token budget)."""
        t = self.limits.tokens
        return None if t is None else t - self.tokens - self.reserved

    def samples_left(self) -> int | None:
        """Samples that may still be started (``None``: no shared sample budget)."""
        s = self.limits.samples
        return None if s is None else s - self.started

    def in_flight(self) -> dict[str, int]:
        """Samples in flight per query id."""
        flying: dict[str, int] = {}
        for f in self.flights.flights():
            flying[f.run_id] = flying.get(f.run_id, 0) + f.pending
        return flying

    # -- launching and consuming calls -------------------------------------------------------------

    def request_for(self, run: QueryRun) -> SamplingRequest:
        """The query's request as sent: with log-probs when the verifier needs them; when the allocator
        monitors traces, with the top ``k`` alternatives per token (each sample's confidence) and, to a
        backend whose engine cuts traces (``SamplingRequest.cut``), once the allocator has a threshold for
        the query (:meth:`~allocators.Allocator.cut_below`), asking it to cut the samples under it (those
        of one call are cut one by one inside vLLM, no event per token)."""
        req, parts = run.query.request, self.parts
        params = req.params
        if self.logprobs and not params.get("logprobs"):
            params = {**params, "logprobs": True}
        cut = None
        if self.monitor is not None:
            window, top = self.monitor
            params = {**params, **({"logprobs": True, "top_logprobs": top} if req.kind == "chat"
                                   else {"logprobs": top})}
            cut = TraceCut(window, top, parts.allocator.cut_below(run.state))
        return req if params is req.params and cut is None else replace(req, params=params, cut=cut)

    def call_seed(self, run: QueryRun, salt: int | str) -> int | None:
        return None if self.seed is None else derive_seed(self.seed, run.query.id, salt)

    async def launch(self, run: QueryRun, req: SamplingRequest, n: int, *, max_tokens: int | None,
                     held: int, seed: int | None, streamed: bool) -> Flight:
        """Start one call of ``n`` samples for ``run``: each holds one sample of the budget and
        ``held`` tokens until it is delivered, released or cancelled. ``streamed``: one streamed call
        whose samples are delivered one by one (a one-sample call relays its text to ``on_text``); else
        one ``n=k`` call delivered whole."""
        flight = Flight(run.query.id, n, held, self.flights.now, self.rounds, streamed=streamed)
        if streamed and n == 1:
            flight.progress.on_text = self.on_text
            if self.parts.probe is not None and req.kind == "chat":
                self.probes.setdefault(run.query.id, []).append(TraceProbe(
                    self.parts.probe, flight.progress, partial(self.read_thought, run), partial(self._settle, run)))
        self.started += n
        self.reserved += held * n
        run.started += n
        if streamed:
            self.held += n
            self.engine.count_streaming(n)
        calls = self._streamed(run, req, n, seed, max_tokens, flight) if streamed else \
            self._drawn(run, req, n, seed, max_tokens)
        await self.flights.launch(flight, calls, Fetched.steps)
        return flight

    async def _streamed(self, run: QueryRun, req: SamplingRequest, n: int, seed: int | None,
                        max_tokens: int | None, flight: Flight) -> AsyncIterator[Fetched]:
        """One streamed ``n=k`` call: each sample delivered, scored and keyed, as it finishes, then
        the call's remaining usage. Changes no state."""
        async for item in self.engine.source.stream(req, n, flight.progress, seed=seed, max_tokens=max_tokens):
            if isinstance(item, Usage):
                yield Fetched([], [], [], [], item)
            else:
                yield await self.score(run, req, [item], Usage(0, item.tokens, item.reasoning_tokens))

    async def _drawn(self, run: QueryRun, req: SamplingRequest, n: int, seed: int | None,
                     max_tokens: int | None) -> AsyncIterator[Fetched]:
        """One ``n=k`` call, its samples delivered together, scored and keyed. Changes no state."""
        result = await self.engine.source.draw(req, n, seed=seed, max_tokens=max_tokens)
        yield await self.score(run, req, result.draws, result.usage)

    async def score(self, run: QueryRun, req: SamplingRequest, draws: list[Draw], usage: Usage) -> Fetched:
        """The verifier's scores and the answer keys of finished samples (the verifier's usage joins
        the call's)."""
        usage = Usage(usage.prompt_tokens, usage.completion_tokens, usage.reasoning_tokens)
        scores: list[float | None] = [None] * len(draws)
        verifier = self.parts.verifier
        if verifier is not None and draws:
            engine = self.engine
            ctx = VerifyContext(request=req, reference=run.query.reference, generator=engine.source,
                                http=engine.http, tests=run.query.tests,
                                code=engine.answers.code if engine.answers else None, canon=run.canon,
                                owner=self.owner, endpoints=engine.endpoints)
            try:
                verdict = await verifier.score(ctx, draws)
            except VerifierError as exc:
                raise BackendError(f"Verifier {verifier.name!r} failed: {exc}", code="verifier_failed") from exc
            scores = list(verdict.scores)
            usage.add(verdict.usage)
        raws = await run.canon.extract_all(draws)
        keys = await run.canon.keys(raws)
        return Fetched(draws, raws, keys, scores, usage)

    async def wait(self) -> list[tuple[Flight, object]]:
        """What the calls in flight delivered next (``[]``: the deadline passed first)."""
        return await self.flights.wait(None if self.inline else self.limits.deadline)

    def take(self, done: list[tuple[Flight, object]]) -> set[str]:
        """Bill what was delivered: finished samples join their queries, ended calls free what they
        did not deliver, and a failed call is released before its error is raised. Returns the ids of
        the queries that got samples."""
        touched: set[str] = set()
        for flight, item in done:
            if item is DONE or isinstance(item, BaseException):
                self._release(flight)
                if isinstance(item, BaseException):
                    raise item
                continue
            assert isinstance(item, Fetched)
            run = self.by_id[flight.run_id]
            self._absorb(run, flight, item)
            touched.add(run.query.id)
            if self.inline:
                run.steps = self.flights.now if self.stream else run.steps + item.steps()
        return touched

    def _absorb(self, run: QueryRun, flight: Flight, fetched: Fetched) -> None:
        """Finished samples join their query's state; their cost is billed, their reserve released."""
        for draw, raw, key, score in zip(fetched.draws, fetched.raws, fetched.keys, fetched.scores, strict=True):
            confidence = None
            if self.monitor is not None:
                confidence = trace_confidence(draw.logprobs, run.query.request.kind, *self.monitor)
            add_sample(run, draw, raw, key, score, confidence, flight.round)
        k = min(len(fetched.draws), flight.pending)
        run.usage.add(fetched.usage)
        self.usage.add(fetched.usage)
        if fetched.usage.prompt_tokens:
            self.usage.add(run.learn_prompt(fetched.usage.prompt_tokens))
        self.tokens += fetched.usage.completion_tokens
        self.drawn += len(fetched.draws)
        flight.delivered += k
        self.reserved -= k * flight.reserve
        self._unhold(flight, k)

    def _release(self, flight: Flight) -> None:
        """A call ended: samples it was asked for and did not deliver are not spent."""
        self.started -= flight.pending
        self.reserved -= flight.pending * flight.reserve
        self._unhold(flight, flight.pending)
        flight.delivered = flight.n

    def _unhold(self, flight: Flight, k: int) -> None:
        if flight.streamed and k:
            self.held -= k
            self.engine.count_streaming(-k)

    async def cancel(self, doomed: list[Flight]) -> None:
        """Cancel calls (closing their streams) and bill what they had cost: their prompt tokens (as the
        backend said, else as it said for another call of the query: a call is prefilled as soon as it
        arrives, before its first token), the tokens of their unfinished samples (as last reported, plus
        those they likely generated since: ``Progress.unseen``), and of samples that finished but were
        not taken before the cancel."""
        stale = await self.flights.cancel(doomed)
        late: dict[int, int] = {}
        for flight, item in stale:
            if isinstance(item, Fetched):
                late[id(flight)] = late.get(id(flight), 0) + item.usage.completion_tokens
        for flight in doomed:
            run = self.by_id[flight.run_id]
            prompt = flight.progress.prompt_tokens or (run.call_prompt if flight.progress.sent else 0)
            if prompt:
                self.usage.add(run.learn_prompt(prompt))
            elif flight.progress.sent:
                run.unbilled_prompts += 1
            unseen = flight.progress.unseen() if flight.progress.unseen is not None else 0
            spent = Usage(prompt, flight.progress.tokens + unseen + late.get(id(flight), 0),
                          flight.progress.reasoning_tokens)
            run.usage.add(spent)
            self.usage.add(spent)
            self.tokens += spent.completion_tokens
            self.reserved -= flight.pending * flight.reserve
            self.cancelled += flight.pending
            run.cancelled += flight.pending
            run.cancelled_tokens += spent.completion_tokens
            self._unhold(flight, flight.pending)
            flight.delivered = flight.n

    # -- step-level search: calls that grow a partial solution, and the PRM's step scores ----------

    def continuation(self, run: QueryRun, partial: str, delimiter: str) -> SamplingRequest:
        """The query's request continuing ``partial`` (the steps so far) up to the next ``delimiter``:
        chat: the partial solution as the assistant's unfinished turn (vLLM's
        ``continue_final_message``); completions: appended to the prompt. The prompt prefix is the
        same for every continuation (vLLM's prefix cache). With log-probs when the verifier scores steps
        by them (``likelihood``)."""
        req = run.query.request
        params = {**req.params, "stop": [delimiter]}
        if self.logprobs and not params.get("logprobs"):
            params["logprobs"] = True
        if req.kind == "completion":
            return replace(req, prompt=(req.prompt or "") + partial, params=params)
        if not partial:
            return replace(req, params=params)
        messages = [*(req.messages or []), {"role": "assistant", "content": partial}]
        return replace(req, messages=messages,
                       params={**params, "continue_final_message": True, "add_generation_prompt": False})

    async def generate(self, run: QueryRun, req: SamplingRequest, n: int, max_tokens: int,
                       seed: int | None) -> list[Draw]:
        """``n`` continuations in one call, each within ``max_tokens`` and together within what is left
        of the token budget (fewer when it cannot pay for ``n``; none when it cannot pay for one); their
        cost is billed to the query and the run. The deadline bounds the call."""
        free = self.tokens_free()
        if free is not None:
            n = min(n, free // max(1, max_tokens))
        if n <= 0:
            return []
        held = n * max_tokens if free is not None else 0
        self.reserved += held
        try:
            async with asyncio.timeout(None if self.limits.deadline is None or self.inline else
                                       self.limits.deadline - self.flights.now):
                result = await self.engine.source.draw(req, n, seed=seed, max_tokens=max_tokens)
        except (asyncio.CancelledError, TimeoutError):  # cut off before it said its cost: what it may have cost
            self._bill(run, Usage(run.call_prompt, n * max_tokens))
            raise
        finally:
            self.reserved -= held
        self._bill(run, result.usage)
        return result.draws

    async def read_thought(self, run: QueryRun, thought: str) -> ProbeReading | None:
        """One probe (:mod:`app.probes`): the query's chat request continued from ``thought`` closed
        by the policy's suffix, greedy, within the probe's ``max_tokens``; the answer it reads, keyed
        as any sample's (``None``: the budget could not pay for it, or the call failed: the trace
        simply goes on unprobed)."""
        spec = self.parts.probe
        assert spec is not None
        req = run.query.request
        params = {k: v for k, v in req.params.items() if k not in PROBE_DROPS}
        params.update(temperature=0, continue_final_message=True, add_generation_prompt=False)
        probe = replace(req, messages=[*(req.messages or []), {"role": "assistant", "content": thought + spec.suffix}],
                        params=params)
        try:
            draws = await self.generate(run, probe, 1, spec.max_tokens, None)
        except (BackendError, TimeoutError) as exc:
            _log.warning("probe failed, the trace goes on: %s", exc)
            return None
        if not draws:
            return None
        run.probes += 1
        run.probe_tokens += draws[0].tokens
        text = spec.suffix.rpartition(THINK_END)[2] + (draws[0].text or draws[0].reasoning or "")
        raws = await run.canon.extract_all([Draw(text=text)])
        return ProbeReading((await run.canon.keys(raws))[0], text)

    def _settle(self, run: QueryRun, _probe: TraceProbe) -> None:
        """A query settles on its traces' provisional votes (:mod:`app.probes`): when the allocator
        would call it finished on its finished samples plus those votes, and it is their answers that
        decide it (with the same samples answerless it would not be: a rule that only counts
        samples never stops traces early), every trace offering one stops with it."""
        offers = [(p, r) for p in self.probes.get(run.query.id, ()) if (r := p.offer()) is not None]
        if not offers:
            return
        st, finished = run.state, self.parts.allocator.finished

        def with_votes(answers: Sequence[str | None]) -> QueryState:
            votes = [Sample(answer=a, tokens=p.tokens) for a, (p, _) in zip(answers, offers, strict=True)]
            return QueryState(id=st.id, cap=st.cap, features=st.features, samples=[*st.samples, *votes],
                              prior_difficulty=st.prior_difficulty)

        if finished(with_votes([r.key for _, r in offers])) and not finished(with_votes([None] * len(offers))):
            for p, r in offers:
                p.stop(r.text)

    async def step_scores(self, run: QueryRun, solutions: Sequence[Sequence[str]]) -> list[tuple[list[float], float]]:
        """The policy's process reward model's score of every step of every (partial) solution, with
        the score it would have as a finished solution (the verifier's ``aggregate`` of its steps); its
        cost is billed. A PRM that fails is a 502 (never a silent fallback to whole-sample voting)."""
        verifier = self.parts.verifier
        if not isinstance(verifier, PRMVerifier):
            raise BackendError("Step-level search needs the prm verifier.", code="verifier_failed")
        engine = self.engine
        ctx = VerifyContext(request=run.query.request, http=engine.http, canon=run.canon, owner=self.owner,
                            endpoints=engine.endpoints)
        try:
            scores, usage = await verifier.step_scores(ctx, solutions)
        except VerifierError as exc:
            raise BackendError(f"Verifier {verifier.name!r} failed: {exc}", code="verifier_failed") from exc
        self._bill(run, usage)
        return [(s, verifier.solution_score(s)) for s in scores]

    async def finish_samples(self, run: QueryRun, req: SamplingRequest, draws: list[Draw]) -> None:
        """Whole samples a strategy drew itself (:meth:`generate`) join their query: scored by the
        verifier (its cost billed) and keyed, as a call's deliveries are."""
        fetched = await self.score(run, req, draws, Usage())
        self._bill(run, fetched.usage)
        for draw, raw, key, score in zip(fetched.draws, fetched.raws, fetched.keys, fetched.scores, strict=True):
            add_sample(run, draw, raw, key, score, None, self.rounds)
        run.started += len(draws)
        self.started += len(draws)
        self.drawn += len(draws)

    async def finish_sample(self, run: QueryRun, draw: Draw, score: float | None) -> None:
        """A solution a search finished joins its query as a sample (keyed like any other)."""
        raws = await run.canon.extract_all([draw])
        keys = await run.canon.keys(raws)
        add_sample(run, draw, raws[0], keys[0], score, None, self.rounds)
        run.started += 1
        self.started += 1
        self.drawn += 1

    def _bill(self, run: QueryRun, usage: Usage) -> None:
        run.usage.add(usage)
        self.usage.add(usage)
        self.tokens += usage.completion_tokens

    async def notify(self) -> None:
        """Tell the caller where the run stands (progress events, checkpoints)."""
        if self.on_round is not None:
            await self.on_round(RoundEvent(self.rounds, self.drawn, self.runs, self.cancelled, self.usage))

    # -- start and end -----------------------------------------------------------------------------

    async def restore(self, resume: Resume) -> None:
        """A checkpoint's samples join their queries (keyed again, in order); its spend is billed."""
        for qid, drawn in resume.samples.items():
            run = self.by_id[qid]
            keys = await run.canon.keys([d.raw for d in drawn])
            for d, key in zip(drawn, keys, strict=True):
                add_sample(run, d.draw, d.raw, key, d.score, d.confidence, d.round)
            run.started += len(drawn)
            self.drawn += len(drawn)
        self.started = self.drawn + resume.cancelled
        self.cancelled = resume.cancelled
        self.usage.add(resume.usage)
        self.tokens = resume.usage.completion_tokens
        self.rounds = resume.rounds

    async def finish_probes(self) -> None:
        """Let the probes still running end (one is at most the probe's ``max_tokens`` of greedy
        decoding, within the deadline): their cost is then what the backend counted, where a probe
        cancelled before it said its usage is billed all it may have cost."""
        tasks = [p.task for probes in self.probes.values() for p in probes if p.task is not None and not p.task.done()]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def close(self) -> None:
        """Cancel (and bill) what is still in flight, probes included; release every count the run still holds in the
        engine's in-flight total, whatever ended the run (an error, a cancel, a deadline)."""
        try:
            for probes in self.probes.values():
                for probe in probes:
                    await probe.close()
            if len(self.flights):
                await self.cancel(self.flights.flights())
        finally:
            if self.held:
                self.engine.count_streaming(-self.held)
                self.held = 0

    def result(self, stop_reason: str) -> RunResult:
        """The run's outcome, one sample selected per query; a passed deadline raises
        :class:`DeadlineExceeded` unless partial results are allowed and some sample finished."""
        partial = stop_reason == "deadline"
        if partial and (self.drawn == 0 or not self.limits.partial_on_deadline):
            raise DeadlineExceeded(f"Deadline passed after {self.rounds} round(s) and {self.drawn} sample(s).",
                                   param="ttc.budget.deadline_ms")
        aggregator = self.parts.aggregator
        for run in self.runs:
            run.selection = run.select(aggregator.select) if run.draws else None
        return RunResult(self.runs, self.rounds, stop_reason, self.usage, self.drawn, partial, self.cancelled)
