"""Verifiers for replay: ``--verifier none | ground_truth | scores | likelihood``.

* ``ground_truth``: the service's ``reference`` verifier, which scores a recorded sample 1.0/0.0 from
  its recorded ``correct`` flag.
* ``scores``: :class:`RecordedScoreVerifier`, the recorded reward-model score of each sample. Scores
  already in [0, 1] are used as they are; a file with any score outside [0, 1] holds raw logits, and
  then every score goes through the logistic ``1 / (1 + exp(-x))`` (one rule per file, so the
  ordering of scores is kept).
* ``likelihood``: the service's ``likelihood`` verifier, ``exp(mean logprob * tokens)`` from the recorded
  ``logprobs`` and ``tokens`` of each sample.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from app.backends.base import Draw
from app.backends.replay import Problem
from app.verifiers import Verifier, VerifierError, VerifyContext, VerifyResult, create_verifier
from app.verifiers.base import clamp01


class RecordedScoreVerifier(Verifier):
    """``Draw.score`` (recorded by the replay backend) as the verifier score."""

    name = "recorded_scores"

    def __init__(self, logits: bool = False) -> None:
        super().__init__()
        self.logits = logits

    async def score(self, ctx: VerifyContext, candidates: Sequence[Draw]) -> VerifyResult:
        out: list[float] = []
        for d in candidates:
            if d.score is None:
                raise VerifierError(f"sample of query {ctx.request.query_id!r} has no recorded score")
            out.append(_logistic(d.score) if self.logits else clamp01(d.score))
        return VerifyResult(out)


def _logistic(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def scores_are_logits(problems: Sequence[Problem]) -> bool:
    """Whether any recorded score lies outside [0, 1] (then the file holds logits)."""
    return any(not 0.0 <= s <= 1.0 for p in problems for s in (p.scores or ()))


def make_verifier(mode: str, logits: bool = False) -> Verifier | None:
    """The verifier of a replay mode (``none`` -> ``None``)."""
    if mode == "none":
        return None
    if mode == "ground_truth":
        return create_verifier("reference")
    if mode == "scores":
        return RecordedScoreVerifier(logits)
    if mode == "likelihood":
        return create_verifier("likelihood")
    raise ValueError(f"unknown replay verifier {mode!r}")
