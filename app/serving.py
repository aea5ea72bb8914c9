"""Serving one OpenAI request: validate, resolve the policy, run the engine, shape the response.

Routes stay thin; this module holds the logic shared by chat and text completions, streaming and
not. A request is turned into a :class:`Prepared` (everything decided before the first sample),
then run; the response is the OpenAI shape with the selected sample as ``choices[0]``, ``usage``
summed over every sample and verifier call, and a ``ttc`` block saying what was spent and why.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from app.backends.base import SamplingRequest, Usage
from app.engine import Query, QueryRun, RunLimits, RunResult, describe_samples
from app.errors import InvalidRequest
from app.policy import PolicyParts, PolicySnapshot, answer_error, resolve
from app.state import AppState
from app.wire import BudgetSpec, ChatCompletionRequest, CompletionRequest, TTCOptions

if TYPE_CHECKING:
    from app.auth import Principal

log = logging.getLogger("ttc.serving")

Kind = Literal["chat", "completion"]


@dataclass(slots=True)
class Prepared:
    kind: Kind
    model: str
    snapshot: PolicySnapshot
    parts: PolicyParts
    queries: list[Query]
    limits: RunLimits
    seed: int | None
    options: TTCOptions
    created: int
    id: str
    principal: Principal | None = None


def merge_budget(policy_budget: BudgetSpec | None, request_budget: BudgetSpec | None) -> BudgetSpec:
    """Request budget fields win over the policy's defaults, field by field."""
    base = policy_budget.model_dump(exclude_none=True) if policy_budget else {}
    over = request_budget.model_dump(exclude_none=True) if request_budget else {}
    return BudgetSpec(**{**base, **over})


async def prepare(state: AppState, body: ChatCompletionRequest | CompletionRequest, kind: Kind,
                  principal: Principal | None = None) -> Prepared:
    """Everything decided before the first sample; raises a 4xx naming the field on bad input.
    A request that names no policy gets its key's default policy, else the service default."""
    if body.n is not None and body.n > 1:
        raise InvalidRequest(
            "n > 1 is not supported: the service draws the samples itself and returns the one it "
            "selects. Set ttc.budget.max_samples to bound the samples and ttc.return_samples to see them.",
            param="n", code="unsupported_value",
        )
    options = body.ttc or TTCOptions()
    model = body.model or state.default_model()
    if not model:
        raise InvalidRequest("No model given and the service has no default model.", param="model")
    requested = options.policy
    if requested is None and principal is not None and principal.default_policy:
        requested = principal.default_policy
    snapshot = await resolve(state.policies, requested)
    budget = merge_budget(snapshot.spec.budget, options.budget)
    limit = state.settings.limits.max_samples
    if budget.max_samples is not None and budget.max_samples > limit:
        raise InvalidRequest(
            f"ttc.budget.max_samples={budget.max_samples} is above this server's limit of {limit}.",
            param="ttc.budget.max_samples", code="budget_too_large",
        )
    seed = body.seed
    parts = await state.parts_for(snapshot, seed)
    if options.answer is not None:
        answer_error(options.answer, "ttc.answer")
        parts.answer = options.answer
    if parts.verifier is not None and parts.verifier.needs_reference and not options.reference:
        raise InvalidRequest(
            f"Verifier {parts.verifier.name!r} needs a reference answer in ttc.reference.",
            param="ttc.reference", code="reference_required",
        )
    params = body.sampling_params()
    if body.logprobs:
        params["logprobs"] = True
    if kind == "chat":
        assert isinstance(body, ChatCompletionRequest)
        messages = [m.model_dump(exclude_none=True) for m in body.messages]
        request = SamplingRequest("chat", model, messages=messages, params=params)
    else:
        assert isinstance(body, CompletionRequest)
        prompt = body.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise InvalidRequest(
                    "Only one prompt per completion request; send several prompts to /v1/ttc/batches.",
                    param="prompt",
                )
            prompt = prompt[0]
        request = SamplingRequest("completion", model, prompt=prompt, params=params)
    cap = budget.max_samples or limit
    deadline = None
    if budget.deadline_ms is not None:
        deadline = asyncio.get_running_loop().time() + budget.deadline_ms / 1000
    limits = RunLimits(samples=cap, tokens=budget.max_tokens, deadline=deadline,
                       partial_on_deadline=options.partial_on_deadline)
    query = Query(id="q0", request=request, cap=cap, reference=options.reference)
    prefix = "chatcmpl" if kind == "chat" else "cmpl"
    return Prepared(kind, model, snapshot, parts, [query], limits, seed, options, int(time.time()),
                    f"{prefix}-ttc-{uuid.uuid4().hex[:24]}", principal)


def policy_cap(parts: PolicyParts, cap: int) -> int:
    """The most samples this query can get: the budget's cap, tightened by the allocator's own
    ``max_samples`` / ``n`` when it has one (so "samples saved" compares with what it could spend)."""
    params = parts.allocator.params
    own = getattr(params, "max_samples", None) or getattr(params, "n", None)
    return min(cap, own) if isinstance(own, int) else cap


def usage_json(usage: Usage) -> dict[str, int]:
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens}


def ttc_block(prep: Prepared, result: RunResult, run: QueryRun) -> dict[str, Any]:
    sel = run.selection
    block: dict[str, Any] = {
        "samples_drawn": run.state.spent,
        "rounds": result.rounds,
        "stop_reason": result.stop_reason,
        "votes": dict(sel.votes) if sel else {},
        "answer": sel.answer if sel else None,
        "confidence": sel.confidence if sel else 0.0,
        "selected_index": sel.index if sel else None,
        "max_samples": policy_cap(prep.parts, run.query.cap),
        "policy": {**prep.snapshot.describe(), "params": prep.parts.allocator.params.model_dump()},
        "partial": result.partial,
    }
    if prep.options.return_samples:
        block["samples"] = describe_samples(run)
    return block


def record_metrics(state: AppState, prep: Prepared, result: RunResult) -> None:
    m, name = state.metrics, prep.snapshot.name
    m.requests.labels(name, "partial" if result.partial else "ok").inc()
    m.samples.labels(name).inc(result.samples_drawn)
    m.samples_saved.labels(name).inc(
        sum(max(0, policy_cap(prep.parts, r.query.cap) - r.state.spent) for r in result.runs))
    m.rounds.labels(name).observe(result.rounds)
    m.stop_reasons.labels(name, result.stop_reason).inc()
    m.tokens.labels(name, "prompt").inc(result.usage.prompt_tokens)
    m.tokens.labels(name, "completion").inc(result.usage.completion_tokens)


async def execute(state: AppState, prep: Prepared, on_round: Any = None) -> RunResult:
    start = time.perf_counter()
    try:
        result = await state.engine.run(prep.queries, prep.parts, prep.limits, seed=prep.seed, on_round=on_round)
    except Exception as exc:
        outcome = getattr(exc, "code", None) or type(exc).__name__
        state.metrics.requests.labels(prep.snapshot.name, str(outcome)).inc()
        raise
    record_metrics(state, prep, result)
    await after_run(state, prep, result, time.perf_counter() - start)
    return result


async def after_run(state: AppState, prep: Prepared, result: RunResult, latency_s: float) -> None:
    """Post-request hooks: charge the key's samples, record the traffic, share what was learned."""
    who = prep.principal
    if who is not None and state.limiter is not None:
        await state.limiter.charge_samples(who, result.samples_drawn)
    if state.recorder is not None:
        state.recorder.submit(prep, result, latency_s, key_id=who.key_id if who else None)
    if state.shared_stats is not None and prep.parts.allocator.shared:
        try:
            await state.shared_stats.publish(prep.snapshot, [r.state for r in result.runs])
        except Exception as exc:
            log.warning("could not publish shared statistics: %s", exc)


def response_json(prep: Prepared, result: RunResult) -> dict[str, Any]:
    run = result.runs[0]
    sel = run.selection
    draw = run.draws[sel.index] if sel else None
    text = draw.text if draw else ""
    finish = (draw.finish_reason if draw else None) or "stop"
    if prep.kind == "chat":
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                  "finish_reason": finish, "logprobs": None}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
        obj = "text_completion"
    return {
        "id": prep.id, "object": obj, "created": prep.created, "model": prep.model,
        "choices": [choice], "usage": usage_json(result.usage), "ttc": ttc_block(prep, result, run),
    }
