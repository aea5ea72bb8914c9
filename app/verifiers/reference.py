"""Reference verifier: 1.0 when a candidate's answer equals the gold answer, else 0.0.

A recorded ``Draw.correct`` wins; otherwise the candidate's answer (``Draw.answer``, else extracted by
the query's answer kind) is compared with ``ctx.reference`` under that kind by
:meth:`app.answers.QueryCanon.same_answer`: numbers, letters, text and JSON inline, math through
math-verify in the bounded worker pool (a time-out there counts as no match), programs by behaviour.
Costs no tokens; never blocks the event loop.
"""

from __future__ import annotations

from collections.abc import Sequence

from app.backends.base import Draw
from app.verifiers.base import Verifier, VerifierError, VerifyContext, VerifyResult


class ReferenceVerifier(Verifier):
    """Equivalence with ``ctx.reference`` under the query's answer kind."""

    name = "reference"
    needs_reference = True

    async def score(self, ctx: VerifyContext, candidates: Sequence[Draw]) -> VerifyResult:
        scores: list[float] = []
        for d in candidates:
            if d.correct is not None:
                scores.append(1.0 if d.correct else 0.0)
                continue
            if ctx.reference is None or ctx.canon is None:
                raise VerifierError("the reference verifier needs a reference answer for this query")
            raw = d.answer if d.answer is not None else ctx.canon.extract(d.text, d.tool_calls)
            scores.append(1.0 if await ctx.canon.same_answer(ctx.reference, raw) else 0.0)
        return VerifyResult(scores)
