"""Answer keys of every recorded sample, computed once per replay (not once per run).

A problem whose answers all key inline (numbers, text, letters) is keyed in this process; the others
are keyed by :func:`app.answers.canon.keys_here` in the parse pool, one task per problem, in parallel
over the pool's workers, each with a hard limit of ``timeout_s`` per answer that needs a worker. A
problem whose task fails or times out keys its answers by their fallbacks (normalised text), and is
counted in :attr:`ReplayKeys.fallbacks`.

Programs under the ``code`` kind with inputs (given, or the prompt's doctest examples) key by
behaviour when a :class:`~app.code.runner.CodeRunner` is given: every distinct program of a problem
runs its calls in the sandbox (all problems concurrently, each program once), through the live
service's :class:`~app.answers.canon.QueryCanon`; a program that cannot run keys by its normalised
text and is counted in :attr:`ReplayKeys.code_fallbacks`. Without a runner they key by text.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from app.answers import AnswerRuntime, AnswerSpec, ParsePool, PoolError, QueryCanon, kind_factory
from app.answers.canon import keys_here, keys_inline
from app.backends.replay import NO_PROGRAM, Problem
from app.code.runner import CodeRunner

Keys = list[str | None]


@dataclass(slots=True)
class ReplayKeys:
    """``keys[p][i]``: the key of problem ``p``'s ``i``-th recorded answer. ``behaviour``: problems
    keyed by their programs' behaviour; ``code_fallbacks``: programs that keyed by text instead."""

    keys: list[Keys]
    fallbacks: int = 0
    pooled: int = 0
    behaviour: int = 0
    code_fallbacks: int = 0

    def known(self, index: int, problem: Problem) -> dict[str, str | None]:
        """Raw answer -> key of one problem (the engine's ``Query.known_keys``); a code problem's
        samples without a program (:data:`~app.backends.replay.NO_PROGRAM`) key to ``None``."""
        known = {raw: key for raw, key in zip(problem.answers, self.keys[index], strict=True) if raw is not None}
        if problem.tests is not None:
            known[NO_PROGRAM] = None
        return known


async def compute_keys(problems: Sequence[Problem], spec: AnswerSpec | None, pool: ParsePool,
                       timeout_s: float = 2.0, max_compare: int = 8, code: CodeRunner | None = None) -> ReplayKeys:
    """Key every problem's recorded answers (see the module doc)."""
    out = ReplayKeys([[] for _ in problems])
    jobs: list[tuple[int, list[str | None]]] = []
    by_behaviour: list[tuple[int, list[str | None]]] = []
    make_kind = kind_factory(spec)
    for i, p in enumerate(problems):
        raws = list(p.answers)
        out.keys[i], deferred = keys_inline(spec, p.question, raws)
        if deferred:
            code_kind = spec is not None and spec.kind == "code"
            (by_behaviour if code_kind and code is not None else jobs).append((i, raws))

    async def one(i: int, raws: list[str | None]) -> None:
        slow = max(1, len(set(raws)))
        try:
            out.keys[i] = await pool.run(keys_here, spec, problems[i].question, raws, max_compare,
                                         timeout_s=timeout_s * slow)
            out.pooled += 1
        except PoolError:
            out.fallbacks += 1

    async def behaviour(i: int, raws: list[str | None], runner: CodeRunner) -> None:
        kind = make_kind(problems[i].question)
        calls: list[str] = list(getattr(kind, "calls", []))
        distinct = list(dict.fromkeys(r for r in raws if r is not None))
        found = await asyncio.gather(*(runner.behaviour(r, calls) for r in distinct))  # then cached
        out.code_fallbacks += sum(b is None for b in found)
        canon = QueryCanon(kind, AnswerRuntime(pool, code=runner, max_compare=max_compare))
        out.keys[i] = await canon.keys(raws)
        out.behaviour += 1

    await asyncio.gather(*(one(i, raws) for i, raws in jobs),
                         *(behaviour(i, raws, code) for i, raws in by_behaviour if code is not None))
    return out
