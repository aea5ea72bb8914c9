"""Wire models of the responses: what a client gets back, and what the service builds them with.

The inference responses and stream chunks are built as these models and serialised by pydantic's
own serializer (:class:`ModelJSON`, :func:`sse`), so the OpenAPI document (``/openapi.json``,
``/docs``) is the shape sent, by construction. Optional extras (a sample list not asked for, a
message without tool calls, a chunk without ``usage``) are left out rather than sent as ``null``.
Requests are in :mod:`app.protocol.requests`. :class:`JSONBytes` sends a plain JSON value (orjson).
"""

from __future__ import annotations

from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from app.protocol.requests import StopReason


class JSONBytes(Response):
    """A JSON response serialised with orjson (no pydantic round trip)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


class ModelJSON(Response):
    """A response model serialised by pydantic's own serializer (no dict in between)."""

    media_type = "application/json"

    def render(self, content: BaseModel) -> bytes:
        return content.__pydantic_serializer__.to_json(content)


def sse(data: BaseModel | dict[str, Any] | str) -> bytes:
    """One server-sent event: a response model, a plain JSON value or a literal (``[DONE]``)."""
    if isinstance(data, BaseModel):
        payload = data.__pydantic_serializer__.to_json(data)
    else:
        payload = data.encode() if isinstance(data, str) else orjson.dumps(data)
    return b"data: " + payload + b"\n\n"


def _absent(value: Any) -> bool:
    return value is None


class _Out(BaseModel):
    model_config = ConfigDict(extra="allow")


def optional(description: str | None = None) -> Any:
    """A field left out of the JSON when it is ``None``."""
    return Field(None, exclude_if=_absent, description=description)


class ErrorDetail(_Out):
    message: str = Field(description="What went wrong, for a person")
    type: str = Field(description="invalid_request_error, not_found_error, authentication_error, "
                                  "permission_error, rate_limit_error, backend_error, service_unavailable, "
                                  "timeout_error, internal_error, ...")
    param: str | None = Field(None, description="The request field at fault (dotted path), when one is")
    code: str | None = Field(None, description="A stable machine-readable code (e.g. model_not_found)")


class ErrorEnvelope(_Out):
    """Every error the service returns, whatever its status."""

    error: ErrorDetail


class CompletionTokensDetails(_Out):
    reasoning_tokens: int = Field(description="Thought tokens among the completion tokens (reasoning models)")


class Usage(_Out):
    prompt_tokens: int = Field(description="Prompt tokens over every backend call (samples and verifiers)")
    completion_tokens: int = Field(description="Completion tokens over every sample and verifier call, thoughts "
                                               "included")
    total_tokens: int
    completion_tokens_details: CompletionTokensDetails | None = optional(
        "With a reasoning model: the thought tokens among completion_tokens")


class TTCBlock(_Out):
    """What the service spent on a request and why it stopped."""

    request_id: str = Field(description="The request's id (also the x-request-id response header)")
    samples_drawn: int = Field(description="Samples drawn for the query")
    rounds: int = Field(description="Times the allocator started samples (rounds: one n=k call per query per round)")
    stop_reason: StopReason = Field(
        description="policy: the allocator's rule was satisfied; cap: the per-query cap (the request's or the "
                    "policy's own); no_answer: the policy gave up, no sample carried an answer; no_agreement: the "
                    "policy gave up, no two samples agreed; budget: the sample budget; tokens: the token budget; "
                    "deadline: ttc.budget.deadline_ms")
    votes: dict[str, int] = Field(description="Votes per distinct answer key (truncated samples excluded)")
    answer_scores: dict[str, float] = Field(
        default_factory=dict, description="Per answer key, what the aggregator ranked by: the vote share "
        "(majority), the summed verifier weight (weighted_majority), the best score (best_of_n, verifier_rerank)")
    answer: str | None = Field(description="The selected answer's key (None: no sample had an answer)")
    confidence: float = Field(description="The aggregator's confidence in the answer, 0..1")
    selected_index: int | None = Field(description="Index of the returned sample among the samples drawn")
    truncated: int = Field(description="Samples that stopped at their token limit or were cut (they do not vote "
                                       "while a complete sample exists, and count against the leader's confidence)")
    schedule: Literal["rounds", "stream"] = Field(description="How samples were launched")
    samples_cancelled: int = Field(description="Samples started and cancelled once the query was decided (stream), "
                                               "or at the deadline; not in samples_drawn")
    tokens_cancelled: int = Field(description="Completion tokens the cancelled samples had generated (in usage)")
    samples_speculative: int = Field(0, description="Samples started beyond what the allocator asked for, while the "
                                     "backends were idle (stream schedule; any not needed are among the cancelled)")
    samples_cut: int = Field(description="Traces stopped mid-way by a confidence monitor (deepconf); they do not vote")
    samples_probed: int = Field(0, description="Traces stopped mid-thought because their probed answers agreed "
                                "(policy probe); they vote with that answer")
    probes: int = Field(0, description="Probes made on running thoughts (billed in usage)")
    probe_tokens: int = Field(0, description="Completion tokens the probes generated (in usage)")
    tokens_saved: int = Field(description="Estimated completion tokens saved by stopping traces early: what each cut "
                                          "or probe-stopped trace had left to the mean length of the query's whole "
                                          "traces, less the probes' tokens (may be negative)")
    max_samples: int = Field(description="The most samples the policy could have drawn for this query")
    answer_kind: str = Field(description="How answers were extracted and compared (auto, number, math, ...)")
    policy: dict[str, Any] = Field(
        description="The policy used: name, version, resolved spec and params; for an allocator that learns across "
                    "requests (calibrated_margin, difficulty) also learns: false for an inline spec, which is built "
                    "for this request alone and runs its untrained rule (store it as a policy to learn)")
    partial: bool = Field(description="True when the deadline cut the run and this is the best answer so far")
    thinking_budget: int | None = optional("Thought tokens per sample the backend was held to (reasoning_effort or "
                                           "ttc.budget.max_thinking_tokens)")
    search: dict[str, Any] | None = optional("Step-level search: method, steps, calls, prm_calls, kept (partial "
                                             "solutions kept after each step)")
    samples: list[dict[str, Any]] | None = optional("Every sample (ttc.return_samples)")


class TTCProgress(_Out):
    """A stream's progress event: after each round (stream schedule: each finished or cancelled sample)."""

    round: int
    samples_drawn: int
    samples_cancelled: int
    votes: dict[str, int]


class ToolCall(_Out):
    id: str | None = None
    type: str = "function"
    function: dict[str, Any] = Field(description="{name, arguments}")


class AssistantMessage(_Out):
    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning: str | None = optional("The selected sample's thought (reasoning models; vLLM's field name)")
    reasoning_content: str | None = optional("The thought again under its older name, when the backend used it")
    tool_calls: list[ToolCall] | None = optional("The selected sample's tool calls, when it made some")


class ChatChoice(_Out):
    index: int
    message: AssistantMessage
    finish_reason: str = Field(description="stop, length or tool_calls (of the selected sample)")
    logprobs: dict[str, Any] | None = Field(None, description="The selected sample's log-probs, when asked")


class ChatCompletionResponse(_Out):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    ttc: TTCBlock


class CompletionChoice(_Out):
    index: int
    text: str
    finish_reason: str
    logprobs: dict[str, Any] | None = None


class CompletionResponse(_Out):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    ttc: TTCBlock


class ChatDelta(_Out):
    role: Literal["assistant"] | None = optional()
    reasoning: str | None = optional()
    reasoning_content: str | None = optional()
    content: str | None = optional()
    tool_calls: list[dict[str, Any]] | None = optional()


class ChatChunkChoice(_Out):
    index: int = 0
    delta: ChatDelta
    finish_reason: str | None = None
    logprobs: dict[str, Any] | None = None


class CompletionChunkChoice(_Out):
    index: int = 0
    text: str = ""
    finish_reason: str | None = None
    logprobs: dict[str, Any] | None = None


class ChatCompletionChunk(_Out):
    """One event of a streamed chat completion (see :mod:`app.streaming` for their order)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    ttc: TTCBlock | TTCProgress | None = optional("Progress events, and the ttc block with the last choice")
    usage: Usage | None = optional("The last event when stream_options.include_usage (choices empty)")


class CompletionChunk(_Out):
    """One event of a streamed text completion."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChunkChoice]
    ttc: TTCBlock | TTCProgress | None = optional()
    usage: Usage | None = optional()


class ModelCard(_Out):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "ttc"


class ModelList(_Out):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class BatchProgress(_Out):
    rounds: int
    samples_drawn: int
    samples_cancelled: int = Field(0, description="Samples started and cancelled (they count in the budget)")
    budget_samples: int
    prompts: int


class BatchView(_Out):
    """A batch: its status and progress, and when completed every prompt's result and a summary."""

    id: str
    object: Literal["ttc.batch"] = "ttc.batch"
    status: Literal["queued", "in_progress", "completed", "failed", "cancelled"]
    created: int
    policy: dict[str, Any]
    progress: BatchProgress
    cancel_requested: bool = Field(False, description="A cancel was asked for; the replica running the batch "
                                                      "stops it at its next checkpoint")
    takeovers: int = Field(0, description="Times another replica took the batch over (its replica died)")
    results: list[dict[str, Any]] | None = Field(
        None, description="Per prompt: index, answer, text, samples, confidence, votes, allocation per round, "
                          "correct (with references)")
    summary: dict[str, Any] | None = Field(None, description="samples_drawn, rounds, stop_reason, mean_samples, "
                                                             "usage, accuracy (with references)")
    error: ErrorDetail | None = None


class BatchDeleted(_Out):
    id: str
    object: Literal["ttc.batch.deleted"] = "ttc.batch.deleted"
    deleted: bool


class BatchList(_Out):
    """A page of batches (newest first), without their per-prompt results."""

    object: Literal["list"] = "list"
    data: list[BatchView]
    has_more: bool


class PolicyStats(_Out):
    requests: float = 0
    samples: float = 0
    saved: float = 0
    prompt_tokens: float = 0
    completion_tokens: float = 0
    stop_reasons: dict[str, float] = Field(default_factory=dict)


class LatencyHistogram(_Out):
    le: list[float] = Field(description="Upper bounds of the buckets (the last is +Inf, sent as 1e308)")
    counts: list[float] = Field(description="Cumulative count at each bound")
    count: float
    sum: float


class BackendStats(_Out):
    name: str
    up: bool
    outstanding: int = Field(description="Calls in flight to this backend")
    errors: float = 0
    calls: float = 0


class Stats(_Out):
    object: str = "ttc.stats"
    time: float
    requests: dict[str, float] = Field(description="Requests by outcome (ok, or an error code), all policies")
    policies: dict[str, PolicyStats]
    latency: LatencyHistogram
    backends: list[BackendStats]
    stream_samples_in_flight: float
    sampling_width: float
    batches_running: float


class WhoAmI(_Out):
    object: str = "ttc.whoami"
    role: str
    name: str | None
    key_id: str | None
    auth_enabled: bool


_ERRORS: dict[int, str] = {
    400: "Invalid request: the envelope's param names the field",
    401: "Missing or invalid API key (when auth is enabled)",
    403: "The key may not do this",
    404: "Unknown model, policy or resource",
    429: "Rate limit reached (Retry-After says when to come back)",
    499: "The client disconnected before the answer",
    502: "A backend or verifier answered with an error",
    503: "No backend could serve the request",
    504: "The request's deadline passed",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for these error statuses (all the one envelope)."""
    return {s: {"model": ErrorEnvelope, "description": _ERRORS.get(s, "Error")} for s in statuses}


SSE_EVENT: dict[str, Any] = {
    "type": "object", "description": "One server-sent event: data is a JSON chunk object, or [DONE] at the end",
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"}},
    "required": ["data"],
}


def INFERENCE_RESPONSES(model: type[BaseModel]) -> dict[int | str, dict[str, Any]]:
    """The documented responses of an inference route: the JSON answer, or an SSE stream of chunks."""
    return {
        200: {"model": model, "description": "The selected sample and the ttc block; with stream: true, "
              "text/event-stream of chunk objects ending in data: [DONE]",
              "content": {"text/event-stream": {"schema": SSE_EVENT}}},
        **error_responses(400, 401, 404, 429, 499, 502, 503, 504),
    }


REQUEST_MODELS: dict[str, type[BaseModel]] = {}
"""Request models documented through :func:`request_body` (their schemas join the components)."""


def request_body(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` documenting a JSON body a route parses itself (see :mod:`app.routes.inference`)."""
    REQUEST_MODELS[model.__name__] = model
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def request_schemas() -> dict[str, Any]:
    """Component schemas of every model registered by :func:`request_body`, nested models included."""
    out: dict[str, Any] = {}
    for name, model in REQUEST_MODELS.items():
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        out.update(schema.pop("$defs", {}))
        out[name] = schema
    return out


class PolicyState(_Out):
    """``GET /v1/policies/{name}/state``: the learned state of a policy version's allocator."""

    object: Literal["policy.state"] = "policy.state"
    name: str
    version: int
    allocator: str
    shared: bool = Field(description="The allocator learns across requests (one instance per policy version)")
    state: dict[str, Any] = Field(description="Its state_dict() after pulling the replicas' shared log ({} when it "
                                              "keeps no state)")
    applied: int | None = Field(description="The position in the shared log that state stands at (null: no "
                                            "shared log, or the allocator does not learn)")
