"""Reference verifier: 1.0 when a candidate's answer equals the gold answer, else 0.0.

A recorded ``Draw.correct`` wins; otherwise the candidate's answer (``Draw.answer``, else extracted by
the query's answer kind: a client's regex in an answer worker) is compared with ``ctx.reference`` under
that kind by :meth:`app.answers.QueryCanon.same_answer`: numbers, letters, text and JSON inline, math through
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
        correct = [d.correct for d in candidates]
        pending = [i for i, c in enumerate(correct) if c is None]
        if pending:
            canon, gold = ctx.canon, ctx.reference
            if gold is None or canon is None:
                raise VerifierError("the reference verifier needs a reference answer for this query")
            raws = await canon.extract_all([candidates[i] for i in pending])
            for i, raw in zip(pending, raws, strict=True):
                correct[i] = await canon.same_answer(gold, raw)
        return VerifyResult([1.0 if c else 0.0 for c in correct])
