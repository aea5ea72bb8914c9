"""Answer keys of every recorded sample, computed once per replay (not once per run).

A problem whose answers all key inline (numbers, text, letters) is keyed in this process; the others
are keyed by :func:`app.answers.canon.keys_here` in the parse pool, one task per problem, in parallel
over the pool's workers, each with a hard limit of ``timeout_s`` per answer that needs a worker. A
problem whose task fails or times out keys its answers by their fallbacks (normalised text), and is
counted in :attr:`ReplayKeys.fallbacks`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from app.answers import AnswerSpec, ParsePool, PoolError
from app.answers.canon import keys_here, keys_inline
from app.backends.replay import Problem

Keys = list[str | None]


@dataclass(slots=True)
class ReplayKeys:
    """``keys[p][i]``: the key of problem ``p``'s ``i``-th recorded answer."""

    keys: list[Keys]
    fallbacks: int = 0
    pooled: int = 0

    def known(self, index: int, problem: Problem) -> dict[str, str | None]:
        """Raw answer -> key of one problem (the engine's ``Query.known_keys``)."""
        return {raw: key for raw, key in zip(problem.answers, self.keys[index], strict=True) if raw is not None}


async def compute_keys(problems: Sequence[Problem], spec: AnswerSpec | None, pool: ParsePool,
                       timeout_s: float = 2.0, max_compare: int = 8) -> ReplayKeys:
    """Key every problem's recorded answers (see the module doc)."""
    out = ReplayKeys([[] for _ in problems])
    jobs: list[tuple[int, list[str | None]]] = []
    for i, p in enumerate(problems):
        raws = list(p.answers)
        out.keys[i], deferred = keys_inline(spec, p.question, raws)
        if deferred:
            jobs.append((i, raws))

    async def one(i: int, raws: list[str | None]) -> None:
        slow = max(1, len(set(raws)))
        try:
            out.keys[i] = await pool.run(keys_here, spec, problems[i].question, raws, max_compare,
                                         timeout_s=timeout_s * slow)
            out.pooled += 1
        except PoolError:
            out.fallbacks += 1

    await asyncio.gather(*(one(i, raws) for i, raws in jobs))
    return out
