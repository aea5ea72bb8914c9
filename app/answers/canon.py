"""Canonical vote keys for the samples of one query, with the slow work off the event loop.

:class:`QueryCanon` turns raw answers into keys with its query's :class:`~app.answers.kinds.AnswerKind`:
inline keys (numbers, normalised text, letters, canonical JSON) are computed at once; a
:class:`~app.answers.kinds.Deferred` key goes to a worker: math-verify in the :class:`ParsePool`
(``math_key``: equal to one of the query's last ``max_compare`` earlier non-numeric keys, or new),
programs to the sandboxed :class:`~app.code.runner.CodeRunner` (same outputs on the kind's inputs).
When that work times out, is refused (pool full) or fails, the key is the deferred fallback (the
normalised text) and ``pool.fallback(reason)`` counts it. A raw answer seen before gets its earlier
key (memoised), so each distinct answer costs at most one worker call per query.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from app.answers.extract import number_key
from app.answers.kinds import AnswerKind, Deferred, ExtractJob, Key
from app.answers.mathparse import equivalent, math_key
from app.answers.pool import InlinePool, ParsePool, PoolError
from app.answers.spec import AnswerSpec, kind_factory
from app.sandbox_queue import SANDBOX_FULL

if TYPE_CHECKING:
    from app.code.runner import CodeRunner


class Delivered(Protocol):
    """What :meth:`QueryCanon.extract_all` reads of a delivered sample (an :class:`app.backends.base.Draw`)."""

    @property
    def text(self) -> str: ...

    @property
    def tool_calls(self) -> Sequence[Mapping[str, Any]] | None: ...

    @property
    def answer(self) -> str | None: ...


@dataclass(slots=True)
class AnswerRuntime:
    """What deferred keys need: the parse pool, the code runner (``None``: programs key by text) and
    the per-query bound on math-verify comparisons."""

    pool: ParsePool
    code: CodeRunner | None = None
    max_compare: int = 8


class QueryCanon:
    """Keys for one query's answers (one instance per query; not shared between tasks).

    ``known`` pre-seeds the memo (raw answer -> key), e.g. with keys the replay evaluator computed
    for every recorded answer up front; ``owner``: the API key whose sandbox turns its programs take
    (a full sandbox queue keys them by text, counted as ``sandbox_busy``)."""

    def __init__(self, kind: AnswerKind, runtime: AnswerRuntime | None,
                 known: Mapping[str, Key] | None = None, owner: str | None = None) -> None:
        self.kind = kind
        self.runtime = runtime
        self.owner = owner
        self._memo: dict[str, Key] = dict(known or {})
        self._extracted: dict[str, str | None] = {}  # sample text -> raw answer
        self._symbolic: dict[str, str] = {}  # non-numeric math key -> the raw answer it came from

    def extract(self, text: str, tool_calls: Sequence[Mapping[str, Any]] | None = None) -> str | None:
        """The raw answer of a sample, extracted here (samples with the same text are extracted once).
        A kind whose extraction must run in a worker (``regex``) is extracted by :meth:`extract_all`."""
        if tool_calls:
            return self.kind.extract_from(text, tool_calls)
        if text in self._extracted:
            return self._extracted[text]
        raw = self._extracted[text] = self.kind.extract_from(text, None)
        return raw

    async def extract_all(self, samples: Sequence[Delivered]) -> list[str | None]:
        """The raw answers of delivered samples (``Draw``s): the answer the source set (replay), else the one
        extracted from the text. A kind with ``extract_in_worker`` (``regex``, a client's pattern) sends the texts
        not seen before to the parse pool, a chunk per call under its hard time limit; a chunk that times out,
        is refused or fails gives those samples no answer, counted as ``<kind>_<reason>`` fallbacks."""
        runtime = self.runtime
        if not self.kind.extract_in_worker or runtime is None:
            return [s.answer if s.answer is not None else self.extract(s.text, s.tool_calls) for s in samples]
        todo = list(dict.fromkeys(s.text for s in samples if s.answer is None and s.text not in self._extracted))
        if todo:
            done = await asyncio.gather(*(self._in_worker(runtime.pool, job) for job in self.kind.extract_job(todo)))
            for text, raw in zip(todo, [raw for chunk in done for raw in chunk], strict=True):
                self._extracted[text] = raw
        return [s.answer if s.answer is not None else self._extracted[s.text] for s in samples]

    async def _in_worker(self, pool: ParsePool, job: ExtractJob) -> list[str | None]:
        try:
            raws = await pool.run(job.fn, *job.args)
        except PoolError as exc:
            pool.fallback(f"{self.kind.name}_{exc.reason}")
            return [None] * job.count
        return raws if len(raws) == job.count else [None] * job.count

    async def key(self, raw: str | None) -> Key:
        if raw is None:
            return None
        if raw in self._memo:
            return self._memo[raw]
        found = self.kind.key(raw)
        key = await self._resolve(found) if isinstance(found, Deferred) else found
        self._memo[raw] = key
        return key

    async def keys(self, raws: Sequence[str | None]) -> list[Key]:
        """Keys in order (each may depend on the ones before it)."""
        return [await self.key(r) for r in raws]

    async def _resolve(self, work: Deferred) -> Key:
        runtime = self.runtime
        if work.work == "math":
            if work.fallback is not None and work.fallback in self._symbolic:
                return work.fallback  # the same normal form as an earlier answer
            if runtime is None:
                key = work.fallback
            else:
                try:
                    key = await runtime.pool.run(math_key, work.payload, tuple(self._symbolic.items()),
                                                 runtime.max_compare)
                except PoolError as exc:
                    runtime.pool.fallback(exc.reason)
                    key = work.fallback
            if key is not None and number_key(key) != key and key not in self._symbolic:
                self._symbolic[key] = work.payload
            return key
        if runtime is None or runtime.code is None:
            if runtime is not None:
                runtime.pool.fallback("no_sandbox")
            return work.fallback
        calls = getattr(self.kind, "calls", [])
        try:
            behaviour = await runtime.code.behaviour(work.payload, calls, self.owner)
        except SANDBOX_FULL:
            runtime.pool.fallback("sandbox_busy")
            return work.fallback
        except Exception:
            behaviour = None
        if behaviour is None:
            runtime.pool.fallback("code")
            return work.fallback
        return behaviour

    async def same_answer(self, gold: str, raw: str | None) -> bool:
        """Whether ``raw`` answers ``gold`` under this query's kind (math: math-verify in the pool;
        code: the same behaviour key)."""
        if raw is None:
            return False
        g, a = self.kind.key(gold), self.kind.key(raw)
        if not isinstance(g, Deferred) and not isinstance(a, Deferred):
            return g is not None and g == a
        if self.kind.name == "code":
            key_g, key_a = await self.key(gold), await self.key(raw)
            return key_g is not None and key_g == key_a
        g_fast = g.fallback if isinstance(g, Deferred) else g
        a_fast = a.fallback if isinstance(a, Deferred) else a
        if g_fast is not None and g_fast == a_fast:
            return True
        if self.runtime is None:
            return False
        try:
            return await self.runtime.pool.run(equivalent, gold, raw)
        except PoolError as exc:
            self.runtime.pool.fallback(exc.reason)
            return False


def keys_here(spec: AnswerSpec | None, prompt: str, raws: Sequence[str | None], max_compare: int = 8) -> list[Key]:
    """Every key of one query's answers computed in this process, math-verify included, without a time
    limit: a worker's job (the replay evaluator keys each problem's recorded answers this way, in
    the pool), or offline code's. Programs key by their text."""
    canon = QueryCanon(kind_factory(spec)(prompt), AnswerRuntime(InlinePool(), max_compare=max_compare))
    return asyncio.run(canon.keys(raws))


def keys_inline(spec: AnswerSpec | None, prompt: str, raws: Sequence[str | None]) -> tuple[list[Key], bool]:
    """The keys that need no worker, deferred ones replaced by their fallback; and whether any was
    deferred (then :func:`keys_here` in a worker gives the exact keys)."""
    kind = kind_factory(spec)(prompt)
    out: list[Key] = []
    deferred = False
    for raw in raws:
        found = kind.key(raw) if raw is not None else None
        if isinstance(found, Deferred):
            deferred = True
            found = found.fallback
        out.append(found)
    return out, deferred
