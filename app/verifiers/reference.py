"""Reference verifier: 1.0 when a candidate's answer equals the gold answer, else 0.0.

A recorded ``Draw.correct`` wins; otherwise the answer (``Draw.answer``, else
:func:`app.answers.extract_answer` of the text) is compared with ``ctx.reference`` by
:func:`app.answers.equivalent`. Plain numbers compare inline; anything that needs math-verify runs
in a worker thread so the event loop never blocks. Costs no tokens.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from app.answers import equivalent, extract_answer, number_key
from app.backends.base import Draw
from app.verifiers.base import Verifier, VerifierError, VerifyContext, VerifyResult


class ReferenceVerifier(Verifier):
    """Exact-match (math-equivalence) against ``ctx.reference``."""

    name = "reference"
    needs_reference = True

    async def score(self, ctx: VerifyContext, candidates: Sequence[Draw]) -> VerifyResult:
        scores: list[float | None] = []
        slow: list[tuple[int, str]] = []
        gold_num = number_key(ctx.reference) if ctx.reference is not None else None
        for i, d in enumerate(candidates):
            if d.correct is not None:
                scores.append(1.0 if d.correct else 0.0)
                continue
            if ctx.reference is None:
                raise VerifierError("the reference verifier needs a reference answer for this query")
            answer = d.answer if d.answer is not None else extract_answer(d.text)
            if answer is None:
                scores.append(0.0)
                continue
            ans_num = number_key(answer) if gold_num is not None else None
            if ans_num is not None:
                scores.append(1.0 if ans_num == gold_num else 0.0)
            else:
                scores.append(None)
                slow.append((i, answer))
        if slow:
            gold = ctx.reference or ""
            matches = await asyncio.to_thread(lambda: [equivalent(gold, a) for _, a in slow])
            for (i, _), ok in zip(slow, matches, strict=True):
                scores[i] = 1.0 if ok else 0.0
        return VerifyResult([s if s is not None else 0.0 for s in scores])
