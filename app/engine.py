"""The engine loop: one code path for single requests, batches and offline replay.

``run`` repeats rounds until the allocator's plan is empty or a limit is reached:

1. ``plan = allocator.plan(states, Budget(samples_left, tokens_left))`` (then clamped: never past
   a query's cap, never past the shared sample budget);
2. for every planned query, one ``source.draw(request, n=k)`` call (shared prompt prefix), all
   queries of the round concurrently; with a token budget the per-sample ``max_tokens`` is shrunk so
   that ``k * (max_tokens + verifier reserve) <= tokens_left`` (tokens are never overspent);
3. the verifier scores the new samples; answers are extracted and keyed by the policy's answer kind
   (:mod:`app.answers`; CPU-heavy keys in worker processes, never on the event loop); a sample that
   stopped at its token limit (``finish_reason: length``) is kept but does not vote; states updated.

Then the aggregator selects one sample per query. A deadline cancels the in-flight round (closing
its backend connections) and either raises :class:`DeadlineExceeded` or, when the caller allows
partial results, returns what was drawn so far.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import httpx

from allocators import Budget, QueryState, Sample
from app.aggregators import Candidate, Selection
from app.answers import AnswerRuntime, QueryCanon, build_kind
from app.backends.base import Draw, SampleSource, SamplingRequest, Usage
from app.code.harness import CodeTests
from app.errors import BackendError, DeadlineExceeded
from app.policy import PolicyParts
from app.verifiers import VerifierError, VerifyContext

_DIGIT = re.compile(r"\d")
_NUMBER = re.compile(r"\d+")
_OPERATOR = re.compile(r"[-+*/×÷^=]|\b(plus|minus|times|add|subtract|multiply|divide|sum|product)\b", re.I)


def prompt_features(text: str) -> dict[str, float]:
    """Cheap numeric features of a prompt for difficulty models (no tokenizer, no I/O)."""
    numbers = _NUMBER.findall(text)
    return {
        "chars": float(len(text)),
        "digits": float(len(_DIGIT.findall(text))),
        "numbers": float(len(numbers)),
        "max_number_digits": float(max((len(n) for n in numbers), default=0)),
        "operators": float(len(_OPERATOR.findall(text))),
    }


def derive_seed(seed: int, query_id: str, round_index: int) -> int:
    """A per-call seed from the request seed, the query and the round (stable across runs)."""
    digest = hashlib.blake2b(f"{seed}:{query_id}:{round_index}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") & 0x7FFFFFFF


@dataclass(slots=True)
class Query:
    """One prompt to answer. ``cap`` is its per-query sample cap."""

    id: str
    request: SamplingRequest
    cap: int
    reference: str | None = None
    prior_difficulty: float | None = None
    known_keys: Mapping[str, str | None] | None = None
    """Answer keys already known for some raw answers (replay computes them up front)."""
    tests: CodeTests | None = None
    """Unit tests of the query's programs (the code_tests verifier)."""


@dataclass(slots=True)
class QueryRun:
    """What happened to one query: its state, raw draws, cost and the final selection."""

    query: Query
    state: QueryState
    canon: QueryCanon
    draws: list[Draw] = field(default_factory=list)
    raws: list[str | None] = field(default_factory=list)
    keys: list[str | None] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    rounds: int = 0
    selection: Selection | None = None


    async def is_correct(self, reference: str | None = None) -> bool | None:
        """Whether the selected answer matches ``reference`` (default: the query's) under the query's
        answer kind; ``None`` without a reference."""
        gold = reference if reference is not None else self.query.reference
        if gold is None:
            return None
        sel = self.selection
        if sel is None or sel.answer is None:
            return False
        return await self.canon.same_answer(gold, self.raws[sel.index])


@dataclass(slots=True)
class RunLimits:
    """Shared limits of a run. ``deadline`` is an absolute ``loop.time()`` value."""

    samples: int | None = None
    tokens: int | None = None
    deadline: float | None = None
    partial_on_deadline: bool = False


@dataclass(slots=True)
class RoundEvent:
    round: int
    samples_drawn: int
    runs: Sequence[QueryRun]


@dataclass(slots=True)
class RunResult:
    runs: list[QueryRun]
    rounds: int
    stop_reason: str
    usage: Usage
    samples_drawn: int
    partial: bool = False


RoundCallback = Callable[[RoundEvent], Awaitable[None]]
T = TypeVar("T")


class Engine:
    """Runs policies against a sample source. Stateless between runs; cheap to construct."""

    def __init__(self, source: SampleSource, http: httpx.AsyncClient | None = None,
                 default_max_tokens: int = 256, answers: AnswerRuntime | None = None) -> None:
        self.source = source
        self.http = http
        self.default_max_tokens = default_max_tokens
        self.answers = answers

    async def run(
        self,
        queries: Sequence[Query],
        parts: PolicyParts,
        limits: RunLimits,
        *,
        seed: int | None = None,
        on_round: RoundCallback | None = None,
    ) -> RunResult:
        runs = []
        features = parts.allocator.uses_features
        for q in queries:
            prompt = q.request.prompt_text()
            state = QueryState(id=q.id, cap=q.cap, features=prompt_features(prompt) if features else {},
                               prior_difficulty=q.prior_difficulty)
            canon = QueryCanon(build_kind(parts.answer, prompt), self.answers, q.known_keys)
            runs.append(QueryRun(q, state, canon))
        by_id = {r.query.id: r for r in runs}
        states = [r.state for r in runs]
        usage = Usage()
        drawn = tokens_used = rounds = 0
        reserve = parts.verifier.reserve_tokens if parts.verifier is not None else 0
        stop_reason = "policy"
        partial = False
        loop = asyncio.get_running_loop()

        while True:
            if limits.deadline is not None and loop.time() >= limits.deadline:
                stop_reason = "deadline"
                break
            samples_left = None if limits.samples is None else limits.samples - drawn
            tokens_left = None if limits.tokens is None else limits.tokens - tokens_used
            if samples_left is not None and samples_left <= 0:
                stop_reason = "budget"
                break
            if tokens_left is not None and tokens_left < 1 + reserve:
                stop_reason = "tokens"
                break
            plan = _clamp(parts.allocator.plan(states, Budget(samples_left, tokens_left)), by_id, samples_left)
            if not plan:
                stop_reason = "cap" if all(s.room == 0 for s in states) else "policy"
                break
            per_sample_max = None
            if tokens_left is not None:
                plan = _fit_tokens(plan, tokens_left, reserve)
                if not plan:
                    stop_reason = "tokens"
                    break
                per_sample_max = (tokens_left - sum(plan.values()) * reserve) // sum(plan.values())
            rounds += 1
            calls = [
                self._draw(by_id[qid], k, seed, rounds, per_sample_max, parts) for qid, k in plan.items()
            ]
            try:
                async with asyncio.timeout_at(limits.deadline):
                    if self.source.inline or len(calls) == 1:  # replay, or one call: no tasks needed
                        results = await _in_turn(calls)
                    else:
                        results = await asyncio.gather(*calls)
            except TimeoutError:
                stop_reason = "deadline"
                break
            for run, (round_usage, n_new) in zip((by_id[q] for q in plan), results, strict=True):
                usage.add(round_usage)
                drawn += n_new
                tokens_used += round_usage.completion_tokens
                run.rounds += 1
            if on_round is not None:
                await on_round(RoundEvent(rounds, drawn, runs))

        if stop_reason == "deadline":
            if drawn == 0 or not limits.partial_on_deadline:
                raise DeadlineExceeded(
                    f"Deadline passed after {rounds} round(s) and {drawn} sample(s).",
                    param="ttc.budget.deadline_ms",
                )
            partial = True
        for run in runs:
            run.selection = _select(run, parts) if run.draws else None
        if parts.learns:
            parts.allocator.learn(states)
        return RunResult(runs, rounds, stop_reason, usage, drawn, partial)

    async def _draw(
        self, run: QueryRun, k: int, seed: int | None, round_index: int,
        max_tokens: int | None, parts: PolicyParts,
    ) -> tuple[Usage, int]:
        req = run.query.request
        if parts.verifier is not None and parts.verifier.needs_logprobs and not req.params.get("logprobs"):
            req = replace(req, params={**req.params, "logprobs": True})
        call_seed = None if seed is None else derive_seed(seed, run.query.id, round_index)
        if max_tokens is not None:
            max_tokens = min(max_tokens, int(req.params.get("max_tokens") or self.default_max_tokens))
        result = await self.source.draw(req, k, seed=call_seed, max_tokens=max_tokens)
        usage = Usage()
        usage.add(result.usage)
        scores: list[float | None] = [None] * len(result.draws)
        if parts.verifier is not None and result.draws:
            ctx = VerifyContext(request=req, reference=run.query.reference, generator=self.source, http=self.http,
                                tests=run.query.tests, code=self.answers.code if self.answers else None,
                                canon=run.canon)
            try:
                verdict = await parts.verifier.score(ctx, result.draws)
            except VerifierError as exc:
                raise BackendError(f"Verifier {parts.verifier.name!r} failed: {exc}",
                                   code="verifier_failed") from exc
            scores = list(verdict.scores)
            usage.add(verdict.usage)
        raws = [d.answer if d.answer is not None else run.canon.extract(d.text, d.tool_calls) for d in result.draws]
        keys = await run.canon.keys(raws)
        for draw, raw, key, score in zip(result.draws, raws, keys, scores, strict=True):
            truncated = draw.finish_reason == "length"
            run.draws.append(draw)
            run.raws.append(raw)
            run.keys.append(key)
            run.state.samples.append(Sample(answer=None if truncated else key, score=score, tokens=draw.tokens,
                                            logprob=draw.logprob, truncated=truncated))
        run.usage.add(usage)
        return usage, len(result.draws)


async def _in_turn(calls: list[Coroutine[Any, Any, T]]) -> list[T]:
    """Await ``calls`` one after the other; when one raises, the others are closed, never left unawaited."""
    results: list[T] = []
    try:
        for call in calls:
            results.append(await call)
    finally:
        for call in calls[len(results) + 1:]:
            call.close()
    return results


def _clamp(plan: dict[str, int], by_id: dict[str, QueryRun], samples_left: int | None) -> dict[str, int]:
    """Defend the budget whatever the allocator returned: caps first, then the shared budget."""
    out: dict[str, int] = {}
    left = samples_left
    for qid, k in plan.items():
        run = by_id.get(qid)
        if run is None:
            continue
        k = min(int(k), run.state.room)
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
    """Per-sample details for ``return_samples``."""
    return [
        {"index": i, "text": d.text, "answer": key, "score": s.score, "tokens": s.tokens,
         "logprob": s.logprob, "finish_reason": d.finish_reason, "truncated": s.truncated}
        for i, (d, s, key) in enumerate(zip(run.draws, run.state.samples, run.keys, strict=True))
    ]
