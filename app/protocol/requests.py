"""Wire models of the requests: the OpenAI bodies we accept, the ``ttc`` extension object and batches.

Every field a client may send is declared: honoured fields are forwarded to the backend or acted on,
refused ones (:data:`REFUSED`) get a 400 naming the field, and anything else is a 400 too (an unknown
field), so no field is silently dropped. The ``ttc`` object is strict as well.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import from_json

from app.answers.spec import AnswerSpec
from app.code.harness import CodeTests
from app.errors import InvalidRequest, validation_to_error

BUILTIN_POLICY_NAMES = ("default", "confident", "adaptive", "esc", "self-consistency-8", "single", "elimination",
                        "greedy", "uniform", "deepconf")


class VerifierSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)
    name: str = Field(description="reference | reward_model | llm_judge | likelihood | code_tests")
    params: dict[str, Any] = Field(default_factory=dict, description="Params of the verifier")


class ScheduleSpec(BaseModel):
    """How samples are launched: ``rounds`` (one ``n=k`` call per query per round, each round awaited
    whole) or ``stream`` (one streamed call per sample, at most ``width`` in flight per query; the
    allocator decides at every finished sample, and a query it ends has its in-flight samples
    cancelled)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)
    mode: Literal["rounds", "stream"] = Field("rounds", description="rounds | stream")
    width: int = Field(8, ge=1, le=256, description="stream: most samples of one query in flight at once")
    speculate: bool = Field(True, description="stream: while the backends have idle capacity, start at once as many "
                            "samples as this policy's queries usually need (never past its cap or width); the surplus "
                            "is cancelled the moment the allocator calls the query decided")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        return {"mode": data} if isinstance(data, str) else data


class SearchSpec(BaseModel):
    """Step-level search against a process reward model (the ``prm`` verifier): a solution grows one step
    at a time (generation stops at ``step_delimiter`` and continues from the partial solution, so every
    continuation reuses the prompt's prefix cache), and the PRM's step scores decide which partial
    solutions grow. ``beam``: ``width`` beams; each step every kept beam is expanded ``expand`` ways and
    the best ``width / expand`` are kept. ``dvts``: ``width / expand`` independent subtrees, each keeping
    its best one of ``expand`` (diverse). ``particles``: ``width`` particles, each extended by one step
    and resampled in proportion to its step score (particle filtering)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)
    method: Literal["beam", "dvts", "particles"] = Field(description="beam | dvts | particles")
    width: int = Field(8, ge=1, le=256, description="Beams or particles: the solutions finished at most")
    expand: int = Field(4, ge=1, le=64, description="beam, dvts: continuations per kept beam per step")
    max_steps: int = Field(40, ge=1, le=1024, description="Steps a solution may take at most")
    step_tokens: int = Field(128, ge=1, le=32_768, description="Tokens one step may take at most")
    step_delimiter: str = Field("\n\n", min_length=1, max_length=16,
                                description="Where a step ends (\\n for the demo model, \\n\\n for chat models)")


class OptimalChoice(BaseModel):
    """What a difficulty bin gets: ``majority`` (whole samples, ``width`` of them, weighted by the PRM)
    or a step-level search (``beam``, ``dvts``, ``particles``) of ``width``."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)
    method: Literal["majority", "beam", "dvts", "particles"]
    width: int = Field(ge=1, le=256)


class OptimalSpec(BaseModel):
    """Compute-optimal test-time compute (Snell et al.): ``probe`` whole samples estimate a query's
    difficulty by their agreement (the leading answer's share of the votes), the ``bins`` thresholds
    (descending shares) put it in a bin (bin ``i``: below ``i`` thresholds; 0 is the easiest), and the
    bin's ``table`` entry says how to spend the rest. ``ttc optimal fit`` fits the table from runs."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)
    probe: int = Field(4, ge=1, le=64, description="Whole samples drawn first (they count among the answers)")
    bins: list[float] = Field(description="Agreement thresholds, descending: bin i = how many of them the probe's "
                              "agreement falls below", max_length=16)
    table: list[OptimalChoice] = Field(description="One choice per bin (len(bins) + 1)", min_length=1, max_length=17)

    @model_validator(mode="after")
    def _one_per_bin(self) -> OptimalSpec:
        if len(self.table) != len(self.bins) + 1:
            raise ValueError("table needs one choice per bin: len(bins) + 1 entries")
        if any(a < b for a, b in zip(self.bins, self.bins[1:], strict=False)):
            raise ValueError("bins must be descending agreement thresholds")
        return self


class PolicySpec(BaseModel):
    """An allocation policy: allocator + params, aggregator, optional verifier, answer kind, budget defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)
    allocator: str = Field(description="Allocator name (fixed, adaptive_consistency, esc, margin, elimination, "
                                       "greedy, uniform, two_stage, difficulty, ...)")
    params: dict[str, Any] = Field(default_factory=dict, description="Params of the allocator")
    aggregator: str = Field("majority", description="majority | weighted_majority | best_of_n | verifier_rerank")
    verifier: VerifierSpec | None = Field(None, description="Scores samples (a name or {name, params})")
    answer: AnswerSpec | None = Field(None, description="How answers are extracted and compared (default: auto)")
    budget: BudgetSpec | None = Field(None, description="Default budget of the policy's requests")
    record: bool | None = Field(None, description="Record served samples (None: the service's recording.enabled)")
    schedule: ScheduleSpec | None = Field(None, description="rounds | stream, or {mode, width} (default: rounds)")
    search: SearchSpec | None = Field(None, description="Step-level search with a process reward model instead of "
                                      "whole samples (needs the prm verifier)")
    optimal: OptimalSpec | None = Field(None, description="Compute-optimal: the strategy chosen per query by its "
                                        "estimated difficulty (needs the prm verifier; search gives the step settings)")

    @model_validator(mode="before")
    @classmethod
    def _verifier_shorthand(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("verifier"), str):
            data = {**data, "verifier": {"name": data["verifier"]}}
        return data


class BudgetSpec(BaseModel):
    """Limits of one request: samples per query, completion tokens in total, wall-clock deadline."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)
    max_samples: int | None = Field(None, ge=1, le=1_000_000, description="Most samples drawn for the query")
    max_tokens: int | None = Field(None, ge=1, le=10**12, description="Most completion tokens over all samples "
                                   "(never overspent; the last samples get a smaller max_tokens)")
    deadline_ms: int | None = Field(None, ge=1, le=3_600_000, description="Wall-clock limit of the request")
    max_thinking_tokens: int | None = Field(
        None, ge=0, le=10**9, description="Most thought tokens per sample (reasoning models): the thought is closed "
        "there and the sample answers; overrides reasoning_effort's budget")


ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]


PolicySpec.model_rebuild()


class TTCOptions(BaseModel):
    """The ``ttc`` extension object of a request (sent by the OpenAI SDK through ``extra_body``)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)
    policy: str | PolicySpec | None = Field(
        None, description="A registered policy's name (built in: " + ", ".join(BUILTIN_POLICY_NAMES) + ") or an "
        "inline spec; default: the key's default policy, else the service's (`default`)",
        examples=list(BUILTIN_POLICY_NAMES))
    budget: BudgetSpec | None = Field(None, description="Overrides the policy's budget field by field")
    answer: AnswerSpec | None = Field(None, description="Answer kind for this request (overrides the policy's)")
    schedule: ScheduleSpec | None = Field(None, description="rounds | stream, or {mode, width} (overrides the "
                                           "policy's)")
    tests: CodeTests | None = Field(
        None, description="Tests for the code_tests verifier: {asserts} or {check, entry_point}, optional prompt")
    return_samples: bool = Field(
        False, description="Include every sample (text, answer, score, tokens) in the response")
    partial_on_deadline: bool = Field(
        False, description="At the deadline, answer with what was drawn (ttc.partial: true) instead of a 504")
    reference: str | None = Field(None, max_length=65_536, description="Reference answer for the `reference` verifier")
    priority: Literal["latency", "tokens"] | None = Field(
        None, description="latency (the default where the policy speculates): samples start wide while the backends "
        "are idle; tokens: never more than the allocator asks for")


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False, strict=True)
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)
    include_usage: bool = False


REFUSED: dict[str, str] = {
    "best_of": "best_of is not supported: the service draws and selects samples itself (use ttc.policy and "
               "ttc.budget.max_samples).",
    "echo": "echo is not supported: the service votes on completions, not on the prompt.",
    "suffix": "suffix is not supported by the backends this service fronts.",
    "functions": "functions/function_call are deprecated by OpenAI and not supported: use tools/tool_choice.",
    "function_call": "functions/function_call are deprecated by OpenAI and not supported: use tools/tool_choice.",
    "audio": "audio output is not supported.",
    "prediction": "predicted outputs are not supported.",
    "web_search_options": "web search is not supported.",
    "store": "stored completions are not supported (store must be false or absent).",
    "metadata": "metadata is only meaningful with stored completions, which are not supported.",
    "service_tier": "service tiers are not supported.",
    "modalities": "only the text modality is supported (modalities: [\"text\"]).",
}
"""Fields OpenAI defines that this service refuses (400 naming the field) when set to anything but
their neutral value, with why."""
_NEUTRAL: dict[str, tuple[Any, ...]] = {"best_of": (None, 1), "store": (None, False), "echo": (None, False),
                                        "modalities": (None, ["text"])}


class _SamplingFields(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)
    model: str | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1, le=10**9)
    n: int | None = Field(None, ge=1, le=1024)
    stop: str | list[str] | None = Field(None, max_length=16)
    seed: int | None = Field(None, ge=-(2**63), lt=2**63)
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = Field(None, max_length=1024)
    user: str | None = Field(None, max_length=256)
    # vLLM sampling extras, forwarded when set
    top_k: int | None = Field(None, ge=-1, le=10**6)
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0)
    min_tokens: int | None = Field(None, ge=0, le=10**6)
    ignore_eos: bool | None = None
    # refused (see REFUSED), declared so that the 400 can say why
    best_of: int | None = Field(None, ge=0, le=1024)
    suffix: str | None = None
    service_tier: str | None = None
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    ttc: TTCOptions | None = None

    FORWARDED: ClassVar[tuple[str, ...]] = ("temperature", "top_p", "max_tokens", "stop", "presence_penalty",
                                   "frequency_penalty", "logit_bias", "user", "top_k", "min_p",
                                   "repetition_penalty", "min_tokens", "ignore_eos")

    def sampling_params(self) -> dict[str, Any]:
        """The fields forwarded to the backend (``None`` values dropped)."""
        return {k: getattr(self, k) for k in self.FORWARDED if getattr(self, k) is not None}

    def refused(self) -> str | None:
        """The first refused field this request sets to something other than its neutral value."""
        for name in REFUSED.keys() & self.model_fields_set:
            if getattr(self, name) not in _NEUTRAL.get(name, (None,)):
                return name
        return None


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=10**9)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    # refused (see REFUSED)
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    audio: dict[str, Any] | None = None
    modalities: list[str] | None = None
    prediction: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    reasoning_effort: ReasoningEffort | None = Field(
        None, description="How much a reasoning model may think: each level is a thinking-token budget per sample "
        "(config reasoning.effort_budgets; ttc.budget.max_thinking_tokens overrides it); forwarded to the backend")

    FORWARDED: ClassVar[tuple[str, ...]] = (*_SamplingFields.FORWARDED, "response_format", "tools", "tool_choice",
                                            "parallel_tool_calls", "logprobs", "top_logprobs", "reasoning_effort")

    def sampling_params(self) -> dict[str, Any]:
        out = super().sampling_params()
        if self.max_completion_tokens is not None and "max_tokens" not in out:
            out["max_tokens"] = self.max_completion_tokens
        return out

    @property
    def wants_logprobs(self) -> bool:
        return bool(self.logprobs)


class CompletionRequest(_SamplingFields):
    prompt: str | list[str]
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool | None = None

    FORWARDED: ClassVar[tuple[str, ...]] = (*_SamplingFields.FORWARDED, "logprobs")

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs is not None


class BatchBudget(BaseModel):
    """The shared budget: ``total_samples`` or ``mean_samples`` (x number of prompts), optional tokens."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)
    total_samples: int | None = Field(None, ge=1, le=10**9)
    mean_samples: float | None = Field(None, gt=0, le=10**6)
    total_tokens: int | None = Field(None, ge=1, le=10**12)
    max_samples_per_prompt: int | None = Field(None, ge=1, le=10**6)
    deadline_ms: int | None = Field(None, ge=1, le=86_400_000)

    @model_validator(mode="after")
    def _one_of(self) -> BatchBudget:
        if (self.total_samples is None) == (self.mean_samples is None):
            raise ValueError("give exactly one of total_samples or mean_samples")
        return self


class BatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)
    model: str | None = None
    prompts: list[str] | None = Field(None, min_length=1)
    messages: list[list[ChatMessage]] | None = Field(None, min_length=1)
    references: list[str | None] | None = None
    budget: BatchBudget
    policy: str | PolicySpec | None = None
    answer: AnswerSpec | None = Field(None, description="Answer kind for every prompt (overrides the policy's)")
    schedule: ScheduleSpec | None = Field(None, description="rounds | stream, or {mode, width} (overrides the "
                                          "policy's)")
    max_tokens: int | None = Field(None, ge=1, le=10**9)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stop: str | list[str] | None = Field(None, max_length=16)
    seed: int | None = Field(None, ge=-(2**63), lt=2**63)
    background: bool | None = Field(None, description="Force a background job (202) or a synchronous answer")

    @model_validator(mode="after")
    def _prompts_or_messages(self) -> BatchRequest:
        if (self.prompts is None) == (self.messages is None):
            raise ValueError("give exactly one of prompts or messages")
        return self

    def size(self) -> int:
        return len(self.prompts or self.messages or [])


StopReason = Literal["policy", "cap", "no_answer", "no_agreement", "budget", "tokens", "deadline", "error"]


B = TypeVar("B", bound=BaseModel)


def parse_json(raw: bytes, model: type[B], check: Callable[[Any], None] | None = None) -> B:
    """A request body as ``model``: the one place bodies are parsed. The JSON is read first (bad JSON,
    bad UTF-8 or nesting too deep: a 400 ``invalid_json``), then ``check`` sees the plain value (sizes
    are checked there, before any model is built), then the model validates it (a 400 naming the
    field)."""
    try:
        data = from_json(raw)  # NaN/Infinity parse; the models refuse them where a number is declared
    except ValueError:
        raise InvalidRequest("Request body is not valid JSON.", code="invalid_json") from None
    if check is not None:
        check(data)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_to_error(exc) from None
