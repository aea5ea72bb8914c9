"""Likelihood verifier: the generator's own probability of each whole completion.

``score = exp(sum of token log-probs) = exp(logprob * tokens)`` with ``logprob`` the sample's mean
token log-probability and ``tokens`` its completion tokens, as the backend reported them. A sample
the model wrote almost deterministically scores near 1; one that passed through unlikely tokens
scores near 0. No model call, no tokens spent. The engine asks the backend for log-probs whenever the
policy's verifier sets ``needs_logprobs`` (whether or not the client asked for them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from app.backends.base import Draw
from app.verifiers.base import Verifier, VerifierError, VerifierParams, VerifyContext, VerifyResult, clamp01


class LikelihoodParams(VerifierParams):
    missing: Literal["error", "unweighted"] = Field(
        "error", description="A sample without log-probs: fail the request (error), or score it 1.0 (unweighted: "
        "plain votes, for backends that do not report log-probs)")


class LikelihoodVerifier(Verifier):
    """Scores each sample by its sequence probability under the model that generated it."""

    name = "likelihood"
    Params = LikelihoodParams
    params: LikelihoodParams
    needs_logprobs = True

    async def score(self, ctx: VerifyContext, candidates: Sequence[Draw]) -> VerifyResult:
        if self.params.missing == "unweighted":
            return VerifyResult([1.0 if d.logprob is None else sequence_probability(d) for d in candidates])
        return VerifyResult([sequence_probability(d) for d in candidates])


def sequence_probability(draw: Draw) -> float:
    """``exp(draw.logprob * draw.tokens)`` in [0, 1]; :class:`VerifierError` without a log-prob."""
    if draw.logprob is None:
        raise VerifierError("the likelihood verifier needs token log-probs, and the backend returned none")
    return clamp01(math.exp(min(0.0, draw.logprob) * max(0, draw.tokens)))
