"""Likelihood verifier: the generator's own probability of each completion.

``aggregate: "sum"`` (the default): ``score = exp(sum of token log-probs / T) = exp(logprob * tokens /
T)`` with ``logprob`` the sample's mean token log-probability, ``tokens`` its completion tokens, as the
backend reported them, and ``T`` the ``temperature`` (1: the sequence probability itself; above 1
flattens the weights, so a weighted vote counts agreement more and one likely sample less, CISC's
softmax over confidences, Taubenfeld et al. 2025, "Confidence Improves Self-Consistency in LLMs"). A
sample the model wrote almost deterministically scores near 1; one that passed through unlikely tokens
scores near 0.

``aggregate: "min"``: ``score = exp(min token log-prob / T)``, the weakest link: the probability of the
most surprising token the sample contains. On the demo arithmetic model this is a step checker: a
sampled slip (a wrong digit, a wrongly copied number) is a token the model itself found unlikely, so
the step where the lowest one falls is the first wrong step in 84% of corrupted solutions
(``scripts/eval_prm.py``'s reference rows). It also scores step-level search (:mod:`app.search`)
without a process reward model: a partial solution's score after a step is :meth:`extend` of its
score before it (``min``: the lower of the two; ``sum``: their product), from the log-probs of the
step's own tokens.

No model call, no tokens spent. The engine asks the backend for log-probs whenever the policy's
verifier sets ``needs_logprobs`` (whether or not the client asked for them).
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
        1.0, gt=0.0, le=100.0, description="Divides the log-prob: exp(sum / T) or exp(min / T); above 1 flattens "
        "the weights.")
    aggregate: Literal["sum", "min"] = Field(
        "sum", description="sum: the sequence probability exp(sum of token log-probs / T); min: the probability of "
        "the least likely token, exp(min / T) (scores step-level search without a PRM)")


class LikelihoodVerifier(Verifier):
    """Scores each sample by its sequence probability under the model that generated it."""

    name = "likelihood"
    Params = LikelihoodParams
    params: LikelihoodParams
    needs_logprobs = True

    async def score(self, ctx: VerifyContext, candidates: Sequence[Draw]) -> VerifyResult:
        return VerifyResult([self.extend(1.0, d) for d in candidates])

    def extend(self, prior: float, draw: Draw) -> float:
        """The score of a (partial) solution scored ``prior`` once ``draw`` is appended to it (a whole
        sample: ``prior`` 1), in [0, 1]: ``sum``: ``prior * exp(logprob * tokens / T)``; ``min``: ``min(prior,
        exp(min_logprob / T))``. A draw without log-probs leaves ``prior`` as it is (``missing:
        unweighted``) or raises :class:`VerifierError`."""
        t, lowest = self.params.temperature, self.params.aggregate == "min"
        lp = draw.min_logprob if lowest else draw.logprob
        if lp is None:
            if self.params.missing == "unweighted":
                return prior
            raise VerifierError("the likelihood verifier needs token log-probs, and the backend returned none")
        if lowest:
            return min(prior, math.exp(min(0.0, lp) / t))
        return prior * math.exp(min(0.0, lp) * max(0, draw.tokens) / t)  # an exponent <= 0: in [0, 1]
