"""LLM-judge verifier: the generator grades each candidate.

For each candidate one chat call ``ctx.generator.draw(judge_request, n=1)`` with the model of the
request being served, ``temperature`` and ``max_tokens`` from the params; all candidates are judged
concurrently. The judge prompt is ``rubric`` followed by the question
(``ctx.request.prompt_text()``) and the candidate's text. Score: the last "Score: N" in the
judgement (else the last number), ``N / 10`` clamped to [0, 1]; unparseable -> 0.0. Usage is the sum
of the judge calls' usage.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence

from pydantic import Field, field_validator

from app.backends.base import Draw, DrawResult, SampleSource, SamplingRequest, Usage
from app.verifiers.base import (
    Verifier,
    VerifierError,
    VerifierParams,
    VerifyContext,
    VerifyResult,
    clamp01,
    within_max_tokens,
    within_prompt_chars,
)

DEFAULT_RUBRIC = (
    "You are grading a response to a question. Judge only whether the response's final answer is "
    "correct, on a scale from 0 (certainly wrong) to 10 (certainly correct). Think briefly, then "
    'end with a line of the form "Score: N" where N is an integer from 0 to 10.'
)

_SCORE = re.compile(r"score\s*[:=]\s*\**\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


MAX_RUBRIC_CHARS = 65_536


class LLMJudgeParams(VerifierParams):
    """Bounded like a request's fields: ``max_tokens`` within ``limits.max_tokens``, the rubric (sent with every
    judge call) within ``limits.max_prompt_chars`` and :data:`MAX_RUBRIC_CHARS`, ``temperature`` as OpenAI's."""

    rubric: str = Field(default=DEFAULT_RUBRIC, min_length=1, max_length=MAX_RUBRIC_CHARS,
                        description="Instructions to the judge, sent before the question and each candidate")
    max_tokens: int = Field(default=64, ge=1, le=10**9, description="Completion tokens of one judge call (at most "
                            "limits.max_tokens); reserved from a token budget for every candidate")
    temperature: float = Field(default=0.0, ge=0, le=2)

    _rubric_limit = field_validator("rubric")(within_prompt_chars)
    _tokens_limit = field_validator("max_tokens")(within_max_tokens)


def parse_judgement(text: str) -> float:
    """``N / 10`` clamped to [0, 1] for the last "Score: N" (else the last number); 0.0 if none."""
    matches = _SCORE.findall(text)
    raw = matches[-1] if matches else next(iter(reversed(_NUMBER.findall(text))), None)
    if raw is None:
        return 0.0
    return clamp01(float(raw) / 10.0)


class LLMJudgeVerifier(Verifier):
    """Asks the generator to grade each candidate 0-10."""

    name = "llm_judge"
    Params = LLMJudgeParams
    params: LLMJudgeParams

    @property
    def reserve_tokens(self) -> int:
        return self.params.max_tokens

    def judge_request(self, ctx: VerifyContext, candidate: Draw) -> SamplingRequest:
        content = f"{self.params.rubric}\n\n### Question\n{ctx.request.prompt_text()}\n\n### Response\n{candidate.text}"
        return SamplingRequest(
            kind="chat",
            model=ctx.request.model,
            messages=[{"role": "user", "content": content}],
            params={"temperature": self.params.temperature, "max_tokens": self.params.max_tokens},
        )

    async def score(self, ctx: VerifyContext, candidates: Sequence[Draw]) -> VerifyResult:
        generator = ctx.generator
        if generator is None:
            raise VerifierError("the llm_judge verifier needs a generator")
        results = await asyncio.gather(*(self._judge(generator, ctx, d) for d in candidates))
        usage = Usage()
        scores: list[float] = []
        for r in results:
            usage.add(r.usage)
            scores.append(parse_judgement(r.draws[0].text) if r.draws else 0.0)
        return VerifyResult(scores, usage)

    async def _judge(self, generator: SampleSource, ctx: VerifyContext, candidate: Draw) -> DrawResult:
        return await generator.draw(self.judge_request(ctx, candidate), 1)
