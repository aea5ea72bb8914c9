"""The OpenAI adapter: an OpenAI (chat) completion request becomes a :class:`~app.prepare.RunSpec`, and
its :class:`~app.run.RunResult` the OpenAI response model.

Everything is decided in :meth:`OpenAIServing.prepare`, before the first sample and before a stream's
first byte: refused or unknown fields, ``n > 1``, an unknown model or policy, a budget above the
server's limits and a missing reference are 4xx errors naming the field. The response is the OpenAI
shape with the selected sample as ``choices[0]`` (its text, tool calls and, when asked, log-probs),
``usage`` summed over every sample and verifier call, and a ``ttc`` block saying what was spent and why.

The answer kind of a run: ``ttc.answer``, else the policy's, else what the request implies
(``response_format`` json -> ``json``; ``tools`` -> ``tool_call``), else ``auto``. A greedy request
(``temperature: 0``) draws one sample: every further one would be the same text (and vLLM refuses
``n > 1`` with greedy sampling). A streamed request whose policy draws one sample and needs nothing
assembled at the end is relayed as the backend sends it (``Prepared.passthrough``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

import orjson

from app.answers import AnswerSpec
from app.auth import Principal
from app.backends.base import Draw, SamplingRequest
from app.errors import InvalidRequest
from app.policy import Schedule
from app.prepare import Needs, Preparer, RunSpec
from app.protocol import (
    REFUSED,
    AssistantMessage,
    BudgetSpec,
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    CompletionTokensDetails,
    TTCBlock,
    TTCOptions,
    Usage,
    parse_json,
)
from app.run import Query, QueryRun, RoundCallback, RunLimits, RunResult, describe_samples
from app.runner import Runner

Kind = Literal["chat", "completion"]
Body = ChatCompletionRequest | CompletionRequest
_NO_BUDGET = BudgetSpec()


@dataclass(frozen=True, slots=True)
class Prepared:
    """A request ready to run: its spec and how to shape its response. ``passthrough``: a streaming
    request of one sample, whose text goes to the client as the backend sends it."""

    spec: RunSpec
    kind: Kind
    options: TTCOptions
    response_id: str
    created: int
    wants_logprobs: bool
    passthrough: bool = False


class OpenAIServing:
    """Chat and text completions (see the module doc): :meth:`prepare`, then :meth:`run`, then
    :meth:`response` (or a :class:`~app.streaming.RunStream`)."""

    def __init__(self, preparer: Preparer, runner: Runner) -> None:
        self.preparer = preparer
        self.runner = runner

    def parse(self, raw: bytes, kind: Kind) -> Body:
        """The request body (:func:`~app.protocol.body.parse_json`): a chat's message count and
        text are checked against ``limits`` before any model is built."""
        if kind == "chat":
            return parse_json(raw, ChatCompletionRequest, self._early_size)
        return parse_json(raw, CompletionRequest)

    def _early_size(self, data: Any) -> None:
        messages = data.get("messages") if isinstance(data, dict) else None
        if isinstance(messages, list):
            self.preparer.check_prompt(messages, "messages")

    async def prepare(self, body: Body, kind: Kind, caller: Principal | None, request_id: str,
                      started: float) -> Prepared:
        """Everything decided before the first sample (see the module doc). A request that names no
        policy gets its key's default policy, else (streamed) ``default_stream_policy``, else the
        service default."""
        check_fields(body)
        prep = self.preparer
        check_size(prep, body)
        options = body.ttc or TTCOptions()
        model = prep.model(body.model)
        fallback = prep.stream_policy if body.stream else None  # a plain stream: token by token
        snapshot = await prep.resolve(options.policy, caller, where="ttc.policy", fallback=fallback)
        budget = merge_budget(snapshot.spec.budget, options.budget)
        prep.check_samples(budget.max_samples, "ttc.budget.max_samples")
        params = body.sampling_params()
        if "max_tokens" not in params and model in prep.models.max_tokens:  # the model's own default
            params["max_tokens"] = prep.models.max_tokens[model]
        thinking = thinking_budget(prep, body, budget)
        if thinking is not None:
            params["thinking_token_budget"] = thinking
        per_sample = int(params.get("max_tokens") or prep.default_max_tokens) if budget.max_tokens else None
        parts = await prep.build(
            snapshot, caller, seed=body.seed, where="ttc.policy", answer=options.answer,
            schedule=options.schedule, tokens_per_sample=per_sample,
            needs=Needs(references=bool(options.reference), tests=options.tests is not None, chat=kind == "chat"))
        if options.answer is None and parts.answer is None:
            implied = implied_answer(body)
            if implied is not None:
                parts = parts.with_answer(implied)
        request = sampling_request(body, model, params)
        cap = prep.cap(budget.max_samples, body.temperature)
        passthrough = (body.stream and parts.cap(cap) == 1 and not body.wants_logprobs
                       and not params.get("tools") and parts.verifier is None)
        if passthrough and parts.schedule.mode != "stream":
            parts = replace(parts, schedule=Schedule("stream", parts.schedule.width))
        if options.priority == "tokens" and parts.schedule.speculate:  # never more than the allocator asks
            parts = replace(parts, schedule=replace(parts.schedule, speculate=False))
        limits = RunLimits(samples=cap, tokens=budget.max_tokens, deadline=prep.deadline(budget.deadline_ms),
                           partial_on_deadline=options.partial_on_deadline)
        query = Query(id="q0", request=request, cap=cap, reference=options.reference, tests=options.tests)
        spec = RunSpec(kind, request_id, model, snapshot, parts, (query,), limits, body.seed, caller, started)
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        return Prepared(spec, kind, options, f"{prefix}-{os.urandom(12).hex()}", int(time.time()),
                        body.wants_logprobs, passthrough)

    async def run(self, prep: Prepared, on_round: RoundCallback | None = None,
                  on_text: Callable[[str, bool], None] | None = None) -> RunResult:
        return await self.runner.run(prep.spec, on_round, on_text)

    def response(self, prep: Prepared, result: RunResult) -> ChatCompletionResponse | CompletionResponse:
        """The OpenAI response of a finished run."""
        run, draw = selected(result)
        logprobs = draw.logprobs if draw is not None and prep.wants_logprobs else None
        usage = usage_of(result)
        ttc = ttc_block(prep, result, run)
        if prep.kind == "chat":
            return ChatCompletionResponse(
                id=prep.response_id, created=prep.created, model=prep.spec.model, usage=usage, ttc=ttc,
                choices=[ChatChoice(index=0, message=message(draw), finish_reason=finish_reason(draw),
                                    logprobs=logprobs)])
        return CompletionResponse(
            id=prep.response_id, created=prep.created, model=prep.spec.model, usage=usage, ttc=ttc,
            choices=[CompletionChoice(index=0, text=draw.text if draw else "", finish_reason=finish_reason(draw),
                                      logprobs=logprobs)])


def thinking_budget(prep: Preparer, body: Body, budget: BudgetSpec) -> int | None:
    """Thought tokens per sample: ``ttc.budget.max_thinking_tokens``, else the ``reasoning_effort``'s
    budget (config ``reasoning.effort_budgets``), else none."""
    if budget.max_thinking_tokens is not None:
        return budget.max_thinking_tokens
    effort = body.reasoning_effort if isinstance(body, ChatCompletionRequest) else None
    return None if effort is None else prep.effort_budgets.get(effort)


def check_fields(body: Body) -> None:
    """Refused fields and ``n > 1`` (400s naming the field and saying why)."""
    refused = body.refused()
    if refused is not None:
        raise InvalidRequest(REFUSED[refused], param=refused, code="unsupported_parameter")
    if body.n is not None and body.n > 1:
        raise InvalidRequest(
            "n > 1 is not supported: the service draws the samples itself and returns the one it "
            "selects. Set ttc.budget.max_samples to bound the samples and ttc.return_samples to see them.",
            param="n", code="unsupported_value",
        )


def check_size(prep: Preparer, body: Body) -> None:
    """The request's size against ``limits``: message count, prompt length, per-sample max_tokens."""
    prep.check_max_tokens(body.max_tokens, "max_tokens")
    if isinstance(body, ChatCompletionRequest):
        prep.check_max_tokens(body.max_completion_tokens, "max_completion_tokens")
        prep.check_prompt(body.messages, "messages")
    else:
        prep.check_prompt("".join([body.prompt] if isinstance(body.prompt, str) else body.prompt), "prompt")


def merge_budget(policy_budget: BudgetSpec | None, request_budget: BudgetSpec | None) -> BudgetSpec:
    """Request budget fields win over the policy's defaults, field by field."""
    if request_budget is None or policy_budget is None:
        return request_budget or policy_budget or _NO_BUDGET
    base = policy_budget.model_dump(exclude_none=True)
    over = request_budget.model_dump(exclude_none=True)
    return BudgetSpec(**{**base, **over})


def implied_answer(body: Body) -> AnswerSpec | None:
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


def sampling_request(body: Body, model: str, params: dict[str, Any]) -> SamplingRequest:
    """What the backends are asked: the messages (or the one prompt) and the forwarded fields."""
    if isinstance(body, ChatCompletionRequest):
        messages = [m.model_dump(exclude_none=True) for m in body.messages]
        check_forwardable({**params, "messages": messages})
        return SamplingRequest("chat", model, messages=messages, params=params)
    prompt = body.prompt
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise InvalidRequest("Only one prompt per completion request; send several prompts to /v1/ttc/batches.",
                                 param="prompt")
        prompt = prompt[0]
    check_forwardable(params)
    return SamplingRequest("completion", model, prompt=prompt, params=params)


def ttc_block(prep: Prepared, result: RunResult, run: QueryRun) -> TTCBlock:
    """What was spent on the query and why it stopped (the ``ttc`` block)."""
    sel = run.selection
    parts = prep.spec.parts
    return TTCBlock(
        request_id=prep.spec.id, samples_drawn=run.state.spent, rounds=result.rounds,
        stop_reason=result.stop_reason,
        votes=dict(sel.votes) if sel else {}, answer_scores=dict(sel.answer_scores) if sel else {},
        answer=sel.answer if sel else None,
        confidence=sel.confidence if sel else 0.0, selected_index=sel.index if sel else None,
        truncated=sum(s.truncated for s in run.state.samples), schedule=parts.schedule.mode,
        samples_cancelled=run.cancelled, tokens_cancelled=run.cancelled_tokens, samples_speculative=run.speculative,
        **cut_report(run),
        max_samples=parts.cap(run.query.cap), answer_kind=parts.answer.kind if parts.answer else "auto",
        policy={**prep.spec.snapshot.describe(), "params": parts.allocator.params.model_dump(),
                **({"learns": parts.learns} if parts.allocator.shared else {})},
        partial=result.partial, thinking_budget=run.query.request.params.get("thinking_token_budget"),
        search=run.search,
        samples=describe_samples(run) if prep.options.return_samples else None)


def cut_report(run: QueryRun) -> dict[str, int]:
    """Traces stopped early (a monitor cut them, ``finish_reason: cut``; their probes settled them,
    ``probe``), the probes made, and the tokens stopping saved: what each stopped trace had left to
    reach the mean length of the query's whole finished traces, less the probes' completion tokens."""
    early = ("cut", "probe")
    stopped = [d.tokens for d in run.draws if d.finish_reason in early]
    whole = [d.tokens for d in run.draws if d.finish_reason not in (*early, "length")]
    mean = sum(whole) / len(whole) if whole else 0.0
    return {"samples_cut": sum(d.finish_reason == "cut" for d in run.draws),
            "samples_probed": sum(d.finish_reason == "probe" for d in run.draws),
            "probes": run.probes, "probe_tokens": run.probe_tokens,
            "tokens_saved": round(sum(max(0.0, mean - t) for t in stopped)) - run.probe_tokens}


def usage_of(result: RunResult) -> Usage:
    """The OpenAI ``usage`` of a run (``completion_tokens_details.reasoning_tokens`` when thoughts were
    written)."""
    u = result.usage
    details = CompletionTokensDetails(reasoning_tokens=u.reasoning_tokens) if u.reasoning_tokens else None
    return Usage(prompt_tokens=u.prompt_tokens, completion_tokens=u.completion_tokens, total_tokens=u.total_tokens,
                 completion_tokens_details=details)


def thought_fields(draw: Draw | None) -> dict[str, str]:
    """The selected sample's thought as the client gets it: always ``reasoning`` (vLLM's name), and
    ``reasoning_content`` as well when the backend itself used that older name (its clients were
    written against it)."""
    if draw is None or draw.reasoning is None:
        return {}
    if draw.reasoning_field == "reasoning_content":
        return {"reasoning": draw.reasoning, "reasoning_content": draw.reasoning}
    return {"reasoning": draw.reasoning}


def selected(result: RunResult) -> tuple[QueryRun, Draw | None]:
    run = result.runs[0]
    return run, (run.draws[run.selection.index] if run.selection else None)


def finish_reason(draw: Draw | None) -> str:
    """The selected sample's finish reason as OpenAI clients know them (a trace its probes stopped
    answered: ``stop``)."""
    reason = (draw.finish_reason if draw else None) or "stop"
    return "stop" if reason == "probe" else reason


def message(draw: Draw | None) -> AssistantMessage:
    """The assistant message of the selected sample (content, its thought, and tool calls when it made
    some)."""
    if draw is not None and draw.tool_calls:
        return AssistantMessage(content=draw.text or None, tool_calls=draw.tool_calls, **thought_fields(draw))
    return AssistantMessage(content=draw.text if draw else "", **thought_fields(draw))
