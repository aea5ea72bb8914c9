"""The OpenAI adapter: an OpenAI (chat) completion request becomes a :class:`~app.runner.RunRequest`,
and its :class:`~app.engine.RunResult` the OpenAI response.

Everything is decided in :func:`prepare`, before the first sample and before a stream's first byte:
refused or unknown fields, ``n > 1``, an unknown model or policy, a budget above the server's limits
and a missing reference are 4xx errors naming the field. The response is the OpenAI shape with the
selected sample as ``choices[0]`` (its text, tool calls and, when asked, log-probs), ``usage`` summed
over every sample and verifier call, and a ``ttc`` block saying what was spent and why.

The answer kind of a run: ``ttc.answer``, else the policy's, else what the request implies
(``response_format`` json -> ``json``; ``tools`` -> ``tool_call``), else ``auto``. A greedy request
(``temperature: 0``) draws one sample: every further one would be the same text (and vLLM refuses
``n > 1`` with greedy sampling).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from app.answers import AnswerSpec
from app.auth import Principal
from app.backends.base import Draw, SamplingRequest
from app.engine import Query, QueryRun, RunLimits, RunResult, describe_samples
from app.errors import InvalidRequest, NotFound
from app.policy import PolicyParts, Schedule, answer_error, check_targets, resolve
from app.runner import RunRequest, policy_cap
from app.state import AppState
from app.wire import REFUSED, BudgetSpec, ChatCompletionRequest, CompletionRequest, TTCOptions

Kind = Literal["chat", "completion"]
_NO_BUDGET = BudgetSpec()


@dataclass(slots=True)
class Prepared:
    """A request ready to run: the run itself and how to shape its response."""

    run: RunRequest
    kind: Kind
    options: TTCOptions
    response_id: str
    created: int
    wants_logprobs: bool
    passthrough: bool = False
    """A streaming request of one sample: its text goes to the client as the backend sends it."""


def merge_budget(policy_budget: BudgetSpec | None, request_budget: BudgetSpec | None) -> BudgetSpec:
    """Request budget fields win over the policy's defaults, field by field."""
    if request_budget is None or policy_budget is None:
        return request_budget or policy_budget or _NO_BUDGET
    base = policy_budget.model_dump(exclude_none=True)
    over = request_budget.model_dump(exclude_none=True)
    return BudgetSpec(**{**base, **over})


def check_model(state: AppState, model: str | None) -> str:
    """The request's model (default: the service's); 404 naming ``model`` when no backend serves it."""
    model = model or state.default_model()
    if not model:
        raise InvalidRequest("No model given and the service has no default model.", param="model")
    known = state.known_models()
    if known and model not in known:
        raise NotFound(f"The model {model!r} does not exist; this service serves: {', '.join(known)}.",
                       param="model", code="model_not_found")
    return model


def implied_answer(body: ChatCompletionRequest | CompletionRequest) -> AnswerSpec | None:
    """The answer kind a request implies by what it asks for (JSON output, tool calls)."""
    if isinstance(body, ChatCompletionRequest):
        if body.tools and body.tool_choice != "none":
            return AnswerSpec(kind="tool_call")
        fmt = (body.response_format or {}).get("type")
        if fmt in ("json_object", "json_schema"):
            return AnswerSpec(kind="json")
    return None


def check_forwardable(fields: dict[str, Any]) -> None:
    """Every value forwarded to a backend must be JSON the backend can read: a free-form field
    (``tools``, ``response_format``, a message's extra keys) holding an integer beyond 64 bits is a 400
    naming the field, not a failure on the way out."""
    for name, value in fields.items():
        try:
            orjson.dumps(value)
        except TypeError:
            raise InvalidRequest(f"'{name}' holds a number outside the 64-bit range this service forwards.",
                                 param=name, code="invalid_value") from None


def check_size(state: AppState, body: ChatCompletionRequest | CompletionRequest) -> None:
    """The request's size against ``limits``: message count, prompt length, per-sample max_tokens
    (400 naming the field)."""
    limits = state.settings.limits
    asked = body.max_completion_tokens if isinstance(body, ChatCompletionRequest) else None
    for name, value in (("max_tokens", body.max_tokens), ("max_completion_tokens", asked)):
        if value is not None and value > limits.max_tokens:
            raise InvalidRequest(f"{name}={value} is above this server's limit of {limits.max_tokens} per sample.",
                                 param=name, code="too_large")
    if isinstance(body, ChatCompletionRequest):
        if len(body.messages) > limits.max_messages:
            raise InvalidRequest(f"{len(body.messages)} messages is above this server's limit of "
                                 f"{limits.max_messages}.", param="messages", code="too_large")
        chars = sum(len(m.content) if isinstance(m.content, str) else len(str(m.content or ""))
                    for m in body.messages)
        where = "messages"
    else:
        chars = sum(len(p) for p in ([body.prompt] if isinstance(body.prompt, str) else body.prompt))
        where = "prompt"
    if chars > limits.max_prompt_chars:
        raise InvalidRequest(f"The prompt has {chars} characters, above this server's limit of "
                             f"{limits.max_prompt_chars}.", param=where, code="too_large")


def fit_token_budget(parts: PolicyParts, per_sample: int) -> None:
    """Under a token budget, the allocator's estimate of a sample's tokens is at most the request's
    per-sample ``max_tokens`` (a sample cannot cost more), so a budget of a few short samples buys them."""
    params = parts.allocator.params
    if per_sample < getattr(params, "tokens_per_sample", per_sample) and not parts.learns:
        parts.allocator.params = params.model_copy(update={"tokens_per_sample": per_sample})


async def prepare(state: AppState, body: ChatCompletionRequest | CompletionRequest, kind: Kind,
                  principal: Principal | None, request_id: str, started: float | None = None) -> Prepared:
    """Everything decided before the first sample (see the module doc). A request that names no
    policy gets its key's default policy, else the service default."""
    refused = body.refused()
    if refused is not None:
        raise InvalidRequest(REFUSED[refused], param=refused, code="unsupported_parameter")
    if body.n is not None and body.n > 1:
        raise InvalidRequest(
            "n > 1 is not supported: the service draws the samples itself and returns the one it "
            "selects. Set ttc.budget.max_samples to bound the samples and ttc.return_samples to see them.",
            param="n", code="unsupported_value",
        )
    options = body.ttc or TTCOptions()
    model = check_model(state, body.model)
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
    parts = await state.runner.parts_for(snapshot, body.seed)
    check_targets(snapshot, parts, operator=principal is None or principal.role == "admin")
    if options.answer is not None:
        answer_error(options.answer, "ttc.answer")
    parts.answer = options.answer or parts.answer or implied_answer(body)
    if options.schedule is not None:
        parts.schedule = Schedule.of(options.schedule)
    if parts.verifier is not None and parts.verifier.needs_reference and not options.reference:
        raise InvalidRequest(
            f"Verifier {parts.verifier.name!r} needs a reference answer in ttc.reference.",
            param="ttc.reference", code="reference_required",
        )
    if parts.verifier is not None and parts.verifier.needs_tests and options.tests is None:
        raise InvalidRequest(
            f"Verifier {parts.verifier.name!r} needs tests in ttc.tests ({{asserts}} or {{check, entry_point}}).",
            param="ttc.tests", code="tests_required",
        )
    params = body.sampling_params()
    check_size(state, body)
    if budget.max_tokens is not None:
        fit_token_budget(parts, int(params.get("max_tokens") or state.settings.limits.default_max_tokens))
    if isinstance(body, ChatCompletionRequest):
        messages = [m.model_dump(exclude_none=True) for m in body.messages]
        check_forwardable({**params, "messages": messages})
        request = SamplingRequest("chat", model, messages=messages, params=params)
    else:
        prompt = body.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise InvalidRequest(
                    "Only one prompt per completion request; send several prompts to /v1/ttc/batches.",
                    param="prompt",
                )
            prompt = prompt[0]
        check_forwardable(params)
        request = SamplingRequest("completion", model, prompt=prompt, params=params)
    cap = 1 if body.temperature == 0 else (budget.max_samples or limit)  # greedy samples are all alike
    deadline = None
    if budget.deadline_ms is not None:
        deadline = asyncio.get_running_loop().time() + budget.deadline_ms / 1000
    limits = RunLimits(samples=cap, tokens=budget.max_tokens, deadline=deadline,
                       partial_on_deadline=options.partial_on_deadline)
    query = Query(id="q0", request=request, cap=cap, reference=options.reference, tests=options.tests)
    run = RunRequest(kind, request_id, model, snapshot, parts, [query], limits, body.seed, principal,
                     started if started is not None else time.perf_counter())
    prefix = "chatcmpl" if kind == "chat" else "cmpl"
    # one sample and nothing to assemble at the end (log-probs, tool calls): relay it as it comes
    passthrough = (body.stream and policy_cap(parts, cap) == 1 and not body.wants_logprobs
                   and not params.get("tools") and parts.verifier is None)
    if passthrough:
        parts.schedule = Schedule("stream", parts.schedule.width)
    return Prepared(run, kind, options, f"{prefix}-{os.urandom(12).hex()}", int(time.time()),
                    body.wants_logprobs, passthrough)


def ttc_block(prep: Prepared, result: RunResult, run: QueryRun) -> dict[str, Any]:
    sel = run.selection
    parts = prep.run.parts
    block: dict[str, Any] = {
        "request_id": prep.run.id,
        "samples_drawn": run.state.spent,
        "rounds": result.rounds,
        "stop_reason": result.stop_reason,
        "votes": dict(sel.votes) if sel else {},
        "answer": sel.answer if sel else None,
        "confidence": sel.confidence if sel else 0.0,
        "selected_index": sel.index if sel else None,
        "truncated": sum(s.truncated for s in run.state.samples),
        "schedule": parts.schedule.mode,
        "samples_cancelled": run.cancelled,
        "tokens_cancelled": run.cancelled_tokens,
        **cut_report(run),
        "max_samples": policy_cap(parts, run.query.cap),
        "answer_kind": parts.answer.kind if parts.answer else "auto",
        "policy": {**prep.run.snapshot.describe(), "params": parts.allocator.params.model_dump()},
        "partial": result.partial,
    }
    if prep.options.return_samples:
        block["samples"] = describe_samples(run)
    return block


def cut_report(run: QueryRun) -> dict[str, int]:
    """Traces a monitor cut (``finish_reason: cut``) and the tokens that saved, estimated as what
    each cut trace had left to reach the mean length of the query's uncut finished traces."""
    cut = [d.tokens for d in run.draws if d.finish_reason == "cut"]
    whole = [d.tokens for d in run.draws if d.finish_reason not in ("cut", "length")]
    mean = sum(whole) / len(whole) if whole else 0.0
    return {"samples_cut": len(cut), "tokens_saved": round(sum(max(0.0, mean - t) for t in cut))}


def selected(result: RunResult) -> tuple[QueryRun, Draw | None]:
    run = result.runs[0]
    return run, (run.draws[run.selection.index] if run.selection else None)


def finish_reason(draw: Draw | None) -> str:
    return (draw.finish_reason if draw else None) or "stop"


def message_json(draw: Draw | None) -> dict[str, Any]:
    """The assistant message of the selected sample (content, and tool calls when it made some)."""
    message: dict[str, Any] = {"role": "assistant", "content": draw.text if draw else ""}
    if draw is not None and draw.tool_calls:
        message["tool_calls"] = draw.tool_calls
        message["content"] = draw.text or None
    return message


def response_json(prep: Prepared, result: RunResult) -> dict[str, Any]:
    run, draw = selected(result)
    logprobs = draw.logprobs if draw is not None and prep.wants_logprobs else None
    if prep.kind == "chat":
        choice: dict[str, Any] = {"index": 0, "message": message_json(draw), "finish_reason": finish_reason(draw),
                                  "logprobs": logprobs}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": draw.text if draw else "", "finish_reason": finish_reason(draw),
                  "logprobs": logprobs}
        obj = "text_completion"
    return {
        "id": prep.response_id, "object": obj, "created": prep.created, "model": prep.run.model,
        "choices": [choice], "usage": result.usage.as_dict(), "ttc": ttc_block(prep, result, run),
    }
