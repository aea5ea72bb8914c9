"""``prm``: a process reward model scores every step of a solution (vLLM's pooling runner).

The service talks to the PRM as it would to ``Qwen/Qwen2.5-Math-PRM-7B`` served by vLLM
(``Qwen2ForProcessRewardModel``, ``--runner pooling``; the bundled ``models/arith-prm`` is the same
architecture): ``POST {url}/pooling``. A solution is cut into steps at ``step_delimiter`` (empty pieces
dropped), each step followed by ``step_tag`` (the token the PRM pools at, ``<extra_0>`` for both), and
sent as the assistant turn of a conversation: ``[system?, user: the prompt, assistant: step1<tag>step2<tag>...]``,
one request per solution, concurrently (``format: messages``, any PRM with a chat template); or, for a
PRM whose format is plain text, all solutions in one request as ``input`` texts rendered by
``input_template`` (``{prompt}`` and ``{steps}``; ``format: input``).

The answer: ``{"data": [{"index": i, "data": [[p_wrong, p_right], ...]}, ...], "usage": {"prompt_tokens"}}``,
one pair per step tag. A step's score is ``p_right``; a solution's is the ``aggregate`` of its steps:
``min`` (the weakest step), ``last`` (the last step: with first-error labels, the outcome) or ``prod``.
A reply with another number of pairs than steps is an error, not a score (a PRM served without its
``step_tag_id`` answers no pairs at all). The PRM's prompt tokens count in usage.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any, Literal

import httpx
from pydantic import Field, field_validator

from app.backends.base import Draw, Usage
from app.verifiers.base import Verifier, VerifierError, VerifierParams, VerifyContext, VerifyResult
from app.verifiers.reward_model import check_template


class PRMParams(VerifierParams):
    url: str = Field(min_length=1, max_length=2048, description="Base URL of the vLLM pooling server (no /v1), or "
                     "embedded:NAME for a named endpoint (the embedded PRM: embedded:arith-prm)")
    model: str = Field(min_length=1, max_length=512)
    step_delimiter: str = Field("\n\n", min_length=1, max_length=16,
                                description="Where a solution is cut into steps (\\n\\n for chat models' paragraphs)")
    step_tag: str = Field("<extra_0>", min_length=1, max_length=64, description="The PRM's step-separator token")
    system: str | None = Field(None, max_length=4096, description="A system message for the PRM (Qwen's asks for "
                                                                  "step-by-step reasoning)")
    aggregate: Literal["min", "last", "prod"] = Field("min", description="A solution's score from its step scores")
    format: Literal["messages", "input"] = Field("messages", description="messages: one chat request per solution; "
                                                 "input: every solution in one request, rendered by input_template")
    input_template: str = Field("{prompt}\nA:\n{steps}", max_length=4096,
                                description="format input: the text of one solution ({prompt}, {steps})")
    timeout_s: float = Field(30.0, gt=0, le=600)

    @field_validator("input_template")
    @classmethod
    def _fields(cls, v: str) -> str:
        check_template(v.replace("{steps}", "{response}"))  # the same rules as a reward model's template
        return v


def steps_of(text: str, delimiter: str) -> list[str]:
    """A solution's steps: ``text`` cut at ``delimiter``, empty pieces dropped."""
    return [s for s in text.split(delimiter) if s.strip()]


def aggregate(scores: Sequence[float], how: str) -> float:
    """A solution's score from its step scores (0 for a solution without a step)."""
    if not scores:
        return 0.0
    if how == "last":
        return scores[-1]
    if how == "prod":
        return math.prod(scores)
    return min(scores)


class PRMVerifier(Verifier):
    """Per-step scores from a process reward model (see the module doc)."""

    name = "prm"
    network_params = frozenset({"url"})
    Params = PRMParams
    params: PRMParams

    async def score(self, ctx: VerifyContext, candidates: Sequence[Draw]) -> VerifyResult:
        steps = [steps_of(d.text, self.params.step_delimiter) for d in candidates]
        per_step, usage = await self.step_scores(ctx, steps)
        return VerifyResult([self.solution_score(s) for s in per_step], usage)

    def solution_score(self, step_scores: Sequence[float]) -> float:
        """A solution's score from its steps' (the ``aggregate`` param: ``min``, ``last`` or ``prod``)."""
        return aggregate(step_scores, self.params.aggregate)

    async def step_scores(self, ctx: VerifyContext, solutions: Sequence[Sequence[str]]) -> tuple[list[list[float]],
                                                                                                   Usage]:
        """Every step's score of every solution (given as its steps), and what the PRM spent."""
        if ctx.http is None:
            raise VerifierError("the prm verifier needs the shared HTTP client")
        todo = [i for i, s in enumerate(solutions) if s]
        out: list[list[float]] = [[] for _ in solutions]
        usage = Usage()
        if not todo:
            return out, usage
        prompt = ctx.request.prompt_text()
        if self.params.format == "input":
            tagged = [self._tagged(solutions[i]) for i in todo]
            body = await self._post(ctx, {"model": self.params.model, "input": [
                self.params.input_template.replace("{prompt}", prompt).replace("{steps}", t) for t in tagged]})
            items = self._items(body, len(todo))
            for i, item in zip(todo, items, strict=True):
                out[i] = self._pairs(item, len(solutions[i]))
            usage.add(_usage(body))
            return out, usage
        bodies = await asyncio.gather(*(self._post(ctx, self._messages(prompt, solutions[i])) for i in todo))
        for i, body in zip(todo, bodies, strict=True):
            out[i] = self._pairs(self._items(body, 1)[0], len(solutions[i]))
            usage.add(_usage(body))
        return out, usage

    def _tagged(self, steps: Sequence[str]) -> str:
        return "".join(s + self.params.step_tag for s in steps)

    def _messages(self, prompt: str, steps: Sequence[str]) -> dict[str, Any]:
        p = self.params
        messages = ([{"role": "system", "content": p.system}] if p.system else []) + [
            {"role": "user", "content": prompt}, {"role": "assistant", "content": self._tagged(steps)}]
        return {"model": p.model, "messages": messages}

    async def _post(self, ctx: VerifyContext, payload: dict[str, Any]) -> dict[str, Any]:
        assert ctx.http is not None
        url = ctx.resolve(self.params.url).rstrip("/").removesuffix("/v1") + "/pooling"
        try:
            resp = await ctx.http.post(url, json=payload, timeout=self.params.timeout_s)
        except httpx.HTTPError as e:
            raise VerifierError(f"process reward model at {url} unreachable: {type(e).__name__}: {e}") from e
        if resp.status_code >= 400:
            raise VerifierError(f"process reward model at {url} answered {resp.status_code}")
        try:
            body = resp.json()
        except ValueError as e:
            raise VerifierError(f"process reward model at {url} sent a malformed response: {e}") from e
        if not isinstance(body, dict):
            raise VerifierError(f"process reward model at {url} sent a malformed response")
        return body

    @staticmethod
    def _items(body: dict[str, Any], n: int) -> list[Any]:
        data = body.get("data")
        if not isinstance(data, list) or len(data) != n:
            raise VerifierError(f"process reward model scored {len(data) if isinstance(data, list) else 0} of "
                                f"{n} solutions")
        return [d.get("data") if isinstance(d, dict) else None for d in sorted(
            data, key=lambda d: d.get("index", 0) if isinstance(d, dict) else 0)]

    @staticmethod
    def _pairs(item: Any, steps: int) -> list[float]:
        """P(right) of each step from the PRM's ``[[p_wrong, p_right], ...]``."""
        if not isinstance(item, list) or len(item) != steps:
            found = len(item) if isinstance(item, list) else 0
            raise VerifierError(f"process reward model scored {found} of {steps} steps (is it served with its "
                                "step_tag_id?)")
        scores = []
        for pair in item:
            if not isinstance(pair, list) or not pair or not all(isinstance(v, int | float) for v in pair):
                raise VerifierError(f"process reward model sent a non-numeric step score: {pair!r}")
            scores.append(min(1.0, max(0.0, float(pair[-1]))))
        return scores


def _usage(body: dict[str, Any]) -> Usage:
    u = body.get("usage") or {}
    return Usage(prompt_tokens=int(u.get("prompt_tokens") or 0) if isinstance(u, dict) else 0)
