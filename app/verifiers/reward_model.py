"""Reward-model verifier: scores candidates with a model served by a vLLM OpenAI-compatible server.

One HTTP request per ``score`` call (all candidates batched), through the app's shared
``httpx.AsyncClient`` (``ctx.http``). ``url`` is the server's base URL (``http://host:8000``; a
trailing ``/v1`` is dropped because these endpoints live at the root). Pinned API (vLLM 0.x extra
endpoints, ``vllm serve <model> --task classify|score|reward``):

* ``classify`` — ``POST {url}/classify`` ``{"model", "input": [text, ...]}`` ->
  ``{"data": [{"index", "probs": [p_0, ..., p_k]}, ...], "usage": {"prompt_tokens", ...}}``;
  score = the positive-class probability ``probs[-1]``.
* ``score`` — ``POST {url}/score`` ``{"model", "text_1": prompt, "text_2": [candidate, ...]}`` ->
  ``{"data": [{"index", "score": x}, ...], "usage": {...}}``; score = ``x``.
* ``pooling`` — ``POST {url}/pooling`` ``{"model", "input": [text, ...]}`` ->
  ``{"data": [{"index", "data": reward}, ...], "usage": {...}}``; ``reward`` is a float or a
  (nested) list: the last element is taken, recursively (the last step's positive class for a PRM).

``text`` for classify/pooling is ``template.format(prompt=..., response=...)``; a template names no other
field and carries no conversion or format spec (checked when the policy is saved). Every score outside
[0, 1] is treated as a logit and squashed with the logistic function. ``usage.prompt_tokens`` is
counted as the verifier's spend.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from typing import Any, Literal

import httpx
from pydantic import Field, field_validator

from app.backends.base import Draw, Usage
from app.verifiers.base import (
    Verifier,
    VerifierError,
    VerifierParams,
    VerifyContext,
    VerifyResult,
    squash,
    within_prompt_chars,
)

TEMPLATE_FIELDS = ("prompt", "response")
MAX_TEMPLATE_CHARS = 65_536


class RewardModelParams(VerifierParams):
    url: str = Field(min_length=1, max_length=2048, description="Base URL of the vLLM server (no /v1).")
    model: str = Field(min_length=1, max_length=512)
    endpoint: Literal["classify", "score", "pooling"] = "classify"
    timeout_s: float = Field(default=30.0, gt=0, le=600)
    template: str = Field(
        default="{prompt}\n\n{response}", max_length=MAX_TEMPLATE_CHARS,
        description="Text sent for classify/pooling: the fields {prompt} and {response} (no other field, conversion "
                    "or format spec; {{ and }} are literal braces), at most limits.max_prompt_chars characters.",
    )

    _template_limit = field_validator("template")(within_prompt_chars)

    @field_validator("template")
    @classmethod
    def _named_fields_only(cls, v: str) -> str:
        return check_template(v)


def check_template(template: str) -> str:
    """``template`` if its only replacement fields are ``{prompt}`` and ``{response}``, bare (so formatting it
    can neither fail nor grow beyond the texts it is given); ``ValueError`` otherwise."""
    allowed = " and ".join("{" + f + "}" for f in TEMPLATE_FIELDS)
    try:
        fields = [(name, spec, conversion) for _, name, spec, conversion in string.Formatter().parse(template)
                  if name is not None]
    except ValueError as exc:
        raise ValueError(f"not a valid template ({exc}); use {allowed}, and {{{{ or }}}} for a literal brace") from None
    for name, spec, conversion in fields:
        if name not in TEMPLATE_FIELDS:
            raise ValueError(f"unknown field {{{name}}}: the template's fields are {allowed}")
        if spec or conversion is not None:
            raise ValueError(f"field {{{name}}} may not have a conversion or format spec: use {allowed} as they are")
    return template


def _last_number(value: Any) -> float:
    while isinstance(value, list):
        if not value:
            raise VerifierError("reward model returned an empty reward")
        value = value[-1]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise VerifierError(f"reward model returned a non-numeric reward: {value!r}")
    return float(value)


class RewardModelVerifier(Verifier):
    """Scores with a vLLM-served reward / classification / cross-encoder model."""

    name = "reward_model"
    network_params = frozenset({"url"})
    Params = RewardModelParams
    params: RewardModelParams

    def _url(self) -> str:
        base = self.params.url.rstrip("/")
        base = base.removesuffix("/v1")
        return f"{base}/{self.params.endpoint}"

    def _payload(self, prompt: str, candidates: Sequence[Draw]) -> dict[str, Any]:
        p = self.params
        if p.endpoint == "score":
            return {"model": p.model, "text_1": prompt, "text_2": [d.text for d in candidates]}
        texts = [p.template.format(prompt=prompt, response=d.text) for d in candidates]
        return {"model": p.model, "input": texts}

    def _item_score(self, item: dict[str, Any]) -> float:
        endpoint = self.params.endpoint
        if endpoint == "classify":
            return _last_number(item["probs"])
        if endpoint == "score":
            return _last_number(item["score"])
        return _last_number(item["data"])

    async def score(self, ctx: VerifyContext, candidates: Sequence[Draw]) -> VerifyResult:
        if not candidates:
            return VerifyResult([])
        if ctx.http is None:
            raise VerifierError("the reward_model verifier needs the shared HTTP client")
        url = self._url()
        payload = self._payload(ctx.request.prompt_text(), candidates)
        try:
            resp = await ctx.http.post(url, json=payload, timeout=self.params.timeout_s)
        except httpx.HTTPError as e:
            raise VerifierError(f"reward model at {url} unreachable: {type(e).__name__}: {e}") from e
        if resp.status_code >= 400:
            raise VerifierError(f"reward model at {url} answered {resp.status_code}")  # its body is not passed on
        try:
            body = resp.json()
            data = sorted(body["data"], key=lambda it: it.get("index", 0))
            scores = [squash(self._item_score(it)) for it in data]
            prompt_tokens = int((body.get("usage") or {}).get("prompt_tokens") or 0)
        except VerifierError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise VerifierError(f"reward model at {url} sent a malformed response: {e!r}") from e
        if len(scores) != len(candidates):
            raise VerifierError(f"reward model at {url} scored {len(scores)} of {len(candidates)} candidates")
        return VerifyResult(scores, Usage(prompt_tokens=prompt_tokens))
