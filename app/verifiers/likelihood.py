"""Likelihood verifier: the generator's own probability of each whole completion.

``score = exp(sum of token log-probs / T) = exp(logprob * tokens / T)`` with ``logprob`` the sample's
mean token log-probability, ``tokens`` its completion tokens, as the backend reported them, and ``T``
the ``temperature`` (1: the sequence probability itself; above 1 flattens the weights, so a weighted
vote counts agreement more and one likely sample less, CISC's softmax over confidences, Taubenfeld
et al. 2025, "Confidence Improves Self-Consistency in LLMs"). A sample
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
from app.verifiers.base import Verifier, VerifierError, VerifierParams, VerifyContext, VerifyResult


class LikelihoodParams(VerifierParams):
    missing: Literal["error", "unweighted"] = Field(
        "error", description="A sample without log-probs: fail the request (error), or score it 1.0 (unweighted: "
        "plain votes, for backends that do not report log-probs)")
    temperature: float = Field(
        1.0, gt=0.0, le=100.0, description="Divides the summed log-prob: exp(sum / T); above 1 flattens the weights.")


class LikelihoodVerifier(Verifier):
    """Scores each sample by its sequence probability under the model that generated it."""

    name = "likelihood"
    Params = LikelihoodParams
    params: LikelihoodParams
    needs_logprobs = True

    async def score(self, ctx: VerifyContext, candidates: Sequence[Draw]) -> VerifyResult:
        t = self.params.temperature
        if self.params.missing == "unweighted":
            return VerifyResult([1.0 if d.logprob is None else sequence_probability(d, t) for d in candidates])
        return VerifyResult([sequence_probability(d, t) for d in candidates])


def sequence_probability(draw: Draw, temperature: float = 1.0) -> float:
    """``exp(draw.logprob * draw.tokens / temperature)`` in [0, 1]; :class:`VerifierError` without a log-prob."""
    if draw.logprob is None:
        raise VerifierError("the likelihood verifier needs token log-probs, and the backend returned none")
    return math.exp(min(0.0, draw.logprob) * max(0, draw.tokens) / temperature)  # an exponent <= 0: in [0, 1]
