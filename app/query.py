"""What a run is made of, the vocabulary every part of a run speaks (the service, batches, replay and
the strategies share it): :class:`Query` (a prompt to answer and its cap), :class:`QueryRun` (what
happened to it), :class:`RunLimits`, :class:`RoundEvent`, :class:`RunResult`, checkpoints
(:class:`Drawn`, :class:`Resume`), a call's delivery (:class:`Fetched`); how a finished sample joins
its query (:func:`add_sample`) and is described (:func:`describe_samples`); and the cheap per-prompt
helpers (:func:`prompt_features`, :func:`derive_seed`)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from allocators import QueryState, Sample
from app.aggregators import Candidate, Selection
from app.answers import QueryCanon
from app.backends.base import Draw, SamplingRequest, Usage
from app.code.harness import CodeTests
from app.policy import PolicyParts

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


def derive_seed(seed: int, query_id: str, salt: int | str) -> int:
    """A per-call seed from the request seed, the query and the round (rounds) or sample (stream);
    stable across runs."""
    digest = hashlib.blake2b(f"{seed}:{query_id}:{salt}".encode(), digest_size=4).digest()
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
    sample_rounds: list[int] = field(default_factory=list)
    """Per finished sample, the run's round (stream schedule: launch wave) that started it."""
    selection: Selection | None = None
    started: int = 0
    """Samples started (finished, cancelled or in flight)."""
    cancelled: int = 0
    cancelled_tokens: int = 0
    speculative: int = 0
    """Samples started beyond what the allocator asked for (idle backends, see :mod:`app.sampling`)."""
    call_prompt: int = 0
    """The prompt tokens of one call of this query, once a backend has said (every call has the same
    prompt): what a call cancelled before it said so is billed."""
    search: dict[str, Any] | None = None
    """What a step-level search did for the query (see :mod:`app.search`)."""
    unbilled_prompts: int = 0
    """Calls cancelled before any call of the query said its prompt tokens: billed once one does."""
    probes: int = 0
    """Probes made on the query's running thoughts (:mod:`app.probes`), and their completion tokens."""
    probe_tokens: int = 0
    steps: float = 0.0
    """I/O-free sources (replay): the query's own latency in token steps. Rounds: the sum of its
    rounds' lengths (each round as long as its longest sample); stream: when its last sample came
    (or was cancelled), the clock starting with the run."""

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

    def learn_prompt(self, prompt_tokens: int) -> Usage:
        """A call of the query said its prompt tokens: every call has the same prompt, so the calls
        cancelled before any said so owe that much; it is billed to the query and returned (for the run)."""
        self.call_prompt = prompt_tokens
        owed = Usage(prompt_tokens * self.unbilled_prompts)
        self.usage.add(owed)
        self.unbilled_prompts = 0
        return owed

    def select(self, select: Callable[[list[Candidate]], Selection]) -> Selection:
        """The aggregator's choice among the query's samples (``select``: the aggregator's rule)."""
        return select([
            Candidate(index=i, text=d.text, answer=key, score=s.score, logprob=s.logprob, truncated=s.truncated)
            for i, (d, s, key) in enumerate(zip(self.draws, self.state.samples, self.keys, strict=True))
        ])


@dataclass(slots=True)
class RunLimits:
    """Shared limits of a run. ``deadline`` is an absolute ``loop.time()`` value."""

    samples: int | None = None
    tokens: int | None = None
    deadline: float | None = None
    partial_on_deadline: bool = False


@dataclass(slots=True)
class RoundEvent:
    """Calls finished: after a round (rounds) or after one or more samples (stream). ``usage``: the
    run's spend so far (the engine's own tally: read it, do not keep it)."""

    round: int
    samples_drawn: int
    runs: Sequence[QueryRun]
    samples_cancelled: int = 0
    usage: Usage = field(default_factory=Usage)


@dataclass(slots=True)
class Drawn:
    """A finished sample as a checkpoint keeps it: the draw, its raw answer, verifier score and
    trace confidence (its answer key is recomputed on restore, in order, as it was first)."""

    draw: Draw
    raw: str | None
    score: float | None = None
    confidence: float | None = None
    round: int = 0


@dataclass(slots=True)
class Resume:
    """What a run had done before it was interrupted (a batch taken over by another replica): per
    query its finished samples in order, and the run's spend. The resumed run counts them in every
    budget and continues the per-sample seeds after them, so nothing paid for is drawn again."""

    samples: Mapping[str, Sequence[Drawn]]
    usage: Usage
    cancelled: int = 0
    rounds: int = 0


@dataclass(slots=True)
class RunResult:
    """``samples_drawn``: finished samples; ``samples_cancelled``: started and cancelled (they count in
    the sample budget, and their tokens in ``usage``)."""

    runs: list[QueryRun]
    rounds: int
    stop_reason: str
    usage: Usage
    samples_drawn: int
    partial: bool = False
    samples_cancelled: int = 0

    @property
    def speculative(self) -> int:
        """Samples started beyond what the allocator asked for, over every query."""
        return sum(r.speculative for r in self.runs)


RoundCallback = Callable[[RoundEvent], Awaitable[None]]


@dataclass(slots=True)
class Fetched:
    """What one finished call brought: its samples, their raw answers, keys and scores, and its cost."""

    draws: list[Draw]
    raws: list[str | None]
    keys: list[str | None]
    scores: list[float | None]
    usage: Usage

    def steps(self) -> int:
        """The delivery's time in token steps: its longest sample (0 for a call's closing usage)."""
        return max((d.tokens for d in self.draws), default=0)


def add_sample(run: QueryRun, draw: Draw, raw: str | None, key: str | None, score: float | None,
               confidence: float | None, round_index: int) -> None:
    """A finished sample joins its query. One at its token limit or cut by a trace monitor does not vote."""
    truncated = draw.finish_reason in ("length", "cut")
    run.sample_rounds.append(round_index)
    run.draws.append(draw)
    run.raws.append(raw)
    run.keys.append(key)
    run.state.samples.append(Sample(answer=None if truncated else key, score=score, tokens=draw.tokens,
                                    logprob=draw.logprob, truncated=truncated, confidence=confidence))


def describe_samples(run: QueryRun) -> list[dict[str, Any]]:
    """Per-sample details for ``return_samples`` (``round``: the round, or in the stream schedule the
    launch wave, that started the sample)."""
    return [
        {"index": i, "text": d.text, "answer": key, "score": s.score, "tokens": s.tokens,
         "logprob": s.logprob, "finish_reason": d.finish_reason, "truncated": s.truncated,
         "confidence": s.confidence, "round": r,
         **({"reasoning": d.reasoning, "reasoning_tokens": d.reasoning_tokens} if d.reasoning is not None else {})}
        for i, (d, s, key, r) in enumerate(zip(run.draws, run.state.samples, run.keys, run.sample_rounds,
                                                strict=True))
    ]


def speculation_key(parts: PolicyParts) -> str:
    """Which policy a run's samples-per-query statistics belong to: its allocator and params."""
    allocator = parts.allocator
    return f"{type(allocator).__name__}:{allocator.params.model_dump_json()}"


def needed(allocator: Any, state: QueryState) -> int:
    """The samples the allocator needed, in the order they finished: the shortest prefix after which
    it calls the query finished (all of them when it never does)."""
    samples = state.samples
    for i in range(1, len(samples)):
        if allocator.finished(QueryState(id=state.id, cap=state.cap, features=state.features,
                                         samples=samples[:i], prior_difficulty=state.prior_difficulty)):
            return i
    return len(samples)
