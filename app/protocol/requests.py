"""Wire models of the requests: the OpenAI bodies we accept, the ``ttc`` extension object and batches.

Every field a client may send is declared: honoured fields are forwarded to the backend or acted on,
refused ones (:data:`REFUSED`) get a 400 naming the field, and anything else is a 400 too (an unknown
field), so no field is silently dropped. The ``ttc`` object is strict as well.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any, ClassVar, Literal, Protocol, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    TypeAdapter,
    WithJsonSchema,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema
from pydantic_core import core_schema as cs
from typing_extensions import TypeAliasType

from app.answers.spec import AnswerSpec
from app.code.harness import CodeTests

BUILTIN_POLICY_NAMES = ("default", "confident", "calibrated", "adaptive", "adaptive-probe", "esc", "self-consistency-8",
                        "single", "elimination", "greedy", "uniform", "deepconf", "beam", "dvts", "particles",
                        "beam-likelihood", "compute-optimal", "compute-optimal-likelihood")


def _integral(value: Any) -> Any:
    """JSON says ``5.0 == 5``: a float without a fraction is that integer. Anything else (``5.5``, a string,
    a bool, ``null``) is left as it came, for the strict ``int`` validation to refuse as before."""
    if type(value) is float and value.is_integer():
        return int(value)
    return value


class _IntegralFloats:
    """Annotated metadata: the annotated integer type also takes an integral JSON number (``5.0``); the
    JSON schema stays ``integer`` (which admits ``5.0``) and field constraints (``ge``, ``le``) keep theirs."""

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return cs.no_info_before_validator_function(_integral, handler(source))


Int = Annotated[int, _IntegralFloats()]
"""An integer field of a request: ``5`` or ``5.0`` (not ``5.5``, ``"5"`` or ``true``)."""
IntOrNone = Annotated[int | None, _IntegralFloats()]
"""An optional :data:`Int` (written this way so that ``Field(ge=..., le=...)`` reaches the integer)."""

_Number64 = Annotated[float, WithJsonSchema({"type": "number", "minimum": -(2**63), "maximum": 2**63 - 1})]
ForwardedJSON: Any = TypeAliasType(
    "ForwardedJSON", Union[bool, _Number64, str, list["ForwardedJSON"], dict[str, "ForwardedJSON"], None])  # type: ignore[misc]  # noqa: UP007
"""Documentation only: a JSON value forwarded to the backends as it came (a tool, a message part), whose
numbers fit in 64 bits (a larger integer is a 400: it cannot be forwarded)."""


class _DocumentedAs:
    """Annotated metadata: the field validates as its own type but is documented as ``documented`` (a
    recursive or narrower schema that validation need not spend time on)."""

    def __init__(self, documented: Any) -> None:
        self.adapter: TypeAdapter[Any] = TypeAdapter(documented)

    def __get_pydantic_json_schema__(self, _core: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return handler(self.adapter.core_schema)


_FORWARDED: TypeAdapter[Any] = TypeAdapter(ForwardedJSON)
FreeObject = Annotated[dict[str, Any], _DocumentedAs(dict[str, ForwardedJSON])]
"""A free-form JSON object forwarded to the backends (``tools``, ``response_format``, message parts)."""


def _only(*values: Any, why: str) -> Callable[[dict[str, Any]], None]:
    """``json_schema_extra`` documenting a field by the values the service accepts (``enum``), for a
    field whose type stays wider so that other values reach the check that explains the 400 (``why``)."""
    def document(schema: dict[str, Any]) -> None:
        kept: dict[str, Any] = {k: schema[k] for k in ("title", "default") if k in schema}
        schema.clear()
        schema.update(kept, enum=list(values), description=why)
    return document


def _one_item_list(schema: dict[str, Any]) -> None:
    """``json_schema_extra`` of completions' ``prompt``: a list holds exactly one prompt."""
    for branch in schema.get("anyOf", []):
        if branch.get("type") == "array":
            branch.update(minItems=1, maxItems=1)
    schema["description"] = ("The prompt: a string, or a list of exactly one string (several prompts go to "
                             "/v1/ttc/batches)")


def _stop_schema(schema: dict[str, Any]) -> None:
    """``json_schema_extra`` of ``stop``: ``max_length=16`` bounds the string's characters and the list's items."""
    for branch in schema.get("anyOf", []):
        for inner in branch.get("anyOf", [branch]):
            if inner.get("type") == "array":
                inner["maxItems"] = 16


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
    width: Int = Field(8, ge=1, le=256, description="stream: most samples of one query in flight at once")
    speculate: bool = Field(True, description="stream: while the backends have idle capacity, start at once as many "
                            "samples as this policy's queries usually need (never past its cap or width); the surplus "
                            "is cancelled the moment the allocator calls the query decided")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        return {"mode": data} if isinstance(data, str) else data


class SearchSpec(BaseModel):
    """Step-level search against a process reward model (the ``prm`` verifier) or the generator's own
    token log-probs (the ``likelihood`` verifier, no model call): a solution grows one step at a time
    (generation stops at ``step_delimiter`` and continues from the partial solution, so every
    continuation reuses the prompt's prefix cache), and the step scores decide which partial solutions
    grow. ``beam``: ``width`` beams; each step every kept beam is expanded ``expand`` ways and
    the best ``width / expand`` are kept. ``dvts``: ``width / expand`` independent subtrees, each keeping
    its best one of ``expand`` (diverse). ``particles``: ``width`` particles, each extended by one step
    and resampled in proportion to its step score (particle filtering)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)
    method: Literal["beam", "dvts", "particles"] = Field(description="beam | dvts | particles")
    width: Int = Field(8, ge=1, le=256, description="Beams or particles: the solutions finished at most")
    expand: Int = Field(4, ge=1, le=64, description="beam, dvts: continuations per kept beam per step")
    max_steps: Int = Field(40, ge=1, le=1024, description="Steps a solution may take at most")
    step_tokens: Int = Field(128, ge=1, le=32_768, description="Tokens one step may take at most")
    step_delimiter: str = Field("\n\n", min_length=1, max_length=16,
                                description="Where a step ends (\\n for the demo model, \\n\\n for chat models)")


class ProbeSpec(BaseModel):
    """Probes of running thoughts (Dynasor-CoT; see :mod:`app.probes`): every ``every`` thought tokens a
    streamed chat trace is asked, in a short greedy continuation (the thought closed by ``suffix``), for
    the answer it has got to; a trace whose last ``agree`` answers agree stops and votes with that
    answer, and a query stops once its allocator is satisfied by its finished samples plus the traces
    whose last ``agree - 1`` answers agree. Probes are billed and count in every budget. Needs the
    stream schedule."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)
    every: Int = Field(64, ge=8, le=65_536, description="Thought tokens between two probes of a trace")
    agree: Int = Field(3, ge=2, le=32, description="Consecutive probes of a trace with one answer that stop it")
    max_tokens: Int = Field(24, ge=1, le=256, description="Tokens a probe may generate (the answer line)")
    suffix: str = Field("</think>", min_length=1, max_length=200,
                        description="What closes the thought in a probe (the answer is read from what follows "
                        "the suffix's last </think>, then what the probe generates)")


class OptimalChoice(BaseModel):
    """What a difficulty bin gets: ``majority`` (whole samples, ``width`` of them, weighted by the PRM)
    or a step-level search (``beam``, ``dvts``, ``particles``) of ``width``."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)
    method: Literal["majority", "beam", "dvts", "particles"]
    width: Int = Field(ge=1, le=256)


class OptimalSpec(BaseModel):
    """Compute-optimal test-time compute (Snell et al.): ``probe`` whole samples estimate a query's
    difficulty by their agreement (the leading answer's share of the votes), the ``bins`` thresholds
    (descending shares) put it in a bin (bin ``i``: below ``i`` thresholds; 0 is the easiest), and the
    bin's ``table`` entry says how to spend the rest. ``ttc optimal fit`` fits the table from runs."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)
    probe: Int = Field(4, ge=1, le=64, description="Whole samples drawn first (they count among the answers)")
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
    probe: ProbeSpec | None = Field(None, description="Probes of running thoughts: a trace stops once its probed "
                                    "answers agree (reasoning models; needs the stream schedule)")

    @model_validator(mode="before")
    @classmethod
    def _verifier_shorthand(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("verifier"), str):
            data = {**data, "verifier": {"name": data["verifier"]}}
        return data


class BudgetSpec(BaseModel):
    """Limits of one request: samples per query, completion tokens in total, wall-clock deadline."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)
    max_samples: IntOrNone = Field(None, ge=1, le=1_000_000, description="Most samples drawn for the query")
    max_tokens: IntOrNone = Field(None, ge=1, le=10**12, description="Most completion tokens over all samples "
                                   "(never overspent; the last samples get a smaller max_tokens)")
    deadline_ms: IntOrNone = Field(None, ge=1, le=3_600_000, description="Wall-clock limit of the request")
    max_thinking_tokens: IntOrNone = Field(
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
    priority: Priority | None = Field(
        None, description="latency (the default where the policy speculates): samples start wide while the backends "
        "are idle; tokens: never more than the allocator asks for")


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False, strict=True)
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[FreeObject] | None = None

    @classmethod
    def __get_pydantic_json_schema__(cls, core: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        """Other members (``name``, ``tool_calls``, ...) are forwarded as they came: documented as such."""
        schema = handler(core)
        handler.resolve_ref_schema(schema)["additionalProperties"] = handler(_FORWARDED.core_schema)
        return schema


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


def _refused(name: str) -> Any:
    """A refused field: typed as OpenAI defines it (so that any value reaches :meth:`_SamplingFields.refused`
    and its 400 says why), documented by its neutral values only."""
    neutral = _NEUTRAL.get(name, (None,))
    return Field(None, json_schema_extra=_only(*neutral, why=f"Only {' or '.join(map(json.dumps, neutral))}: "
                                                              f"{REFUSED[name]}"))


class _SamplingFields(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)
    model: str | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: IntOrNone = Field(None, ge=1, le=10**9)
    n: IntOrNone = Field(None, ge=1, le=1024, json_schema_extra=_only(
        None, 1, why="Only null or 1: the service draws the samples itself and returns the one it selects (n > 1 is "
        "a 400); ttc.budget.max_samples bounds the samples, ttc.return_samples shows them"))
    stop: str | list[str] | None = Field(None, max_length=16, json_schema_extra=_stop_schema)
    seed: IntOrNone = Field(None, ge=-(2**63), lt=2**63)
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = Field(None, max_length=1024)
    user: str | None = Field(None, max_length=256)
    # vLLM sampling extras, forwarded when set
    top_k: IntOrNone = Field(None, ge=-1, le=10**6)
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0)
    min_tokens: IntOrNone = Field(None, ge=0, le=10**6)
    ignore_eos: bool | None = None
    # refused (see REFUSED), declared so that the 400 can say why
    best_of: IntOrNone = _refused("best_of")
    suffix: str | None = _refused("suffix")
    service_tier: str | None = _refused("service_tier")
    store: bool | None = _refused("store")
    metadata: dict[str, Any] | None = _refused("metadata")
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
    max_completion_tokens: IntOrNone = Field(None, ge=1, le=10**9)
    logprobs: bool | None = None
    top_logprobs: IntOrNone = Field(None, ge=0, le=20)
    response_format: FreeObject | None = None
    tools: list[FreeObject] | None = None
    tool_choice: str | FreeObject | None = None
    parallel_tool_calls: bool | None = None
    # refused (see REFUSED)
    functions: list[dict[str, Any]] | None = _refused("functions")
    function_call: str | dict[str, Any] | None = _refused("function_call")
    audio: dict[str, Any] | None = _refused("audio")
    modalities: list[str] | None = _refused("modalities")
    prediction: dict[str, Any] | None = _refused("prediction")
    web_search_options: dict[str, Any] | None = _refused("web_search_options")
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
    prompt: str | list[str] = Field(json_schema_extra=_one_item_list)
    logprobs: IntOrNone = Field(None, ge=0, le=20)
    echo: bool | None = _refused("echo")

    FORWARDED: ClassVar[tuple[str, ...]] = (*_SamplingFields.FORWARDED, "logprobs")

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs is not None


def _exactly_one(a: str, a_type: str, b: str, b_type: str) -> dict[str, Any]:
    """A model's ``json_schema_extra``: exactly one of ``a`` and ``b`` is given (not null)."""
    return {"oneOf": [{"required": [a], "properties": {a: {"type": a_type}}},
                      {"required": [b], "properties": {b: {"type": b_type}}}]}


class BatchBudget(BaseModel):
    """The shared budget: ``total_samples`` or ``mean_samples`` (x number of prompts), optional tokens."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True,
                              json_schema_extra=_exactly_one("total_samples", "integer", "mean_samples", "number"))
    total_samples: IntOrNone = Field(None, ge=1, le=10**9, description="Samples over all prompts (at least one "
                                     "per prompt); give this or mean_samples")
    mean_samples: float | None = Field(None, gt=0, le=10**6, description="Samples per prompt on average (times "
                                       "the number of prompts, rounded: at least one per prompt); give this or "
                                       "total_samples")
    total_tokens: IntOrNone = Field(None, ge=1, le=10**12)
    max_samples_per_prompt: IntOrNone = Field(None, ge=1, le=10**6)
    deadline_ms: IntOrNone = Field(None, ge=1, le=86_400_000)

    @model_validator(mode="after")
    def _one_of(self) -> BatchBudget:
        if (self.total_samples is None) == (self.mean_samples is None):
            raise ValueError("give exactly one of total_samples or mean_samples")
        return self


class BatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True,
                              json_schema_extra=_exactly_one("prompts", "array", "messages", "array"))
    model: str | None = None
    prompts: list[str] | None = Field(None, min_length=1, description="Text prompts (give this or messages)")
    messages: list[list[ChatMessage]] | None = Field(None, min_length=1, description="Chat prompts, each a list of "
                                                     "messages (give this or prompts)")
    references: list[str | None] | None = Field(None, description="Reference answers, one per prompt (null: none)")
    budget: BatchBudget
    policy: str | PolicySpec | None = None
    answer: AnswerSpec | None = Field(None, description="Answer kind for every prompt (overrides the policy's)")
    schedule: ScheduleSpec | None = Field(None, description="rounds | stream, or {mode, width} (overrides the "
                                          "policy's)")
    max_tokens: IntOrNone = Field(None, ge=1, le=10**9)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stop: str | list[str] | None = Field(None, max_length=16, json_schema_extra=_stop_schema)
    seed: IntOrNone = Field(None, ge=-(2**63), lt=2**63)
    background: bool | None = Field(None, description="Force a background job (202) or a synchronous answer")

    @model_validator(mode="after")
    def _prompts_or_messages(self) -> BatchRequest:
        if (self.prompts is None) == (self.messages is None):
            raise ValueError("give exactly one of prompts or messages")
        return self

    def size(self) -> int:
        return len(self.prompts or self.messages or [])


class ConfiguredLimits(Protocol):
    """The configured limits (config ``limits``) that bound request fields."""

    max_messages: int
    max_samples: int
    max_tokens: int
    max_prompt_chars: int
    max_batch_prompts: int


def document_limits(schemas: Mapping[str, Any], limits: ConfiguredLimits) -> None:
    """Write this deployment's configured limits into the OpenAPI component schemas of the request models
    (``maximum``/``maxItems``/``maxLength`` on the fields they bound), so that the document says what the
    service accepts. The text of all of a prompt's messages together is bounded as well (said in words)."""

    def branches(model: str, field: str, kind: str) -> list[dict[str, Any]]:
        spec = schemas.get(model, {}).get("properties", {}).get(field)
        return [] if spec is None else [b for b in spec.get("anyOf", [spec]) if b.get("type") == kind]

    def tighten(schema: dict[str, Any], key: str, value: int) -> None:
        schema[key] = min(schema.get(key, value), value)

    for model, field in (("ChatCompletionRequest", "max_tokens"), ("ChatCompletionRequest", "max_completion_tokens"),
                         ("CompletionRequest", "max_tokens"), ("BatchRequest", "max_tokens")):
        for branch in branches(model, field, "integer"):
            tighten(branch, "maximum", limits.max_tokens)
    for branch in branches("BudgetSpec", "max_samples", "integer"):
        tighten(branch, "maximum", limits.max_samples)
    for branch in branches("ChatCompletionRequest", "messages", "array"):
        tighten(branch, "maxItems", limits.max_messages)
    for model, field in (("ChatMessage", "content"), ("CompletionRequest", "prompt"), ("BatchRequest", "prompts")):
        for branch in branches(model, field, "string"):
            tighten(branch, "maxLength", limits.max_prompt_chars)
        for branch in branches(model, field, "array"):
            if branch.get("items", {}).get("type") == "string":
                tighten(branch["items"], "maxLength", limits.max_prompt_chars)
    for branch in branches("BatchRequest", "prompts", "array") + branches("BatchRequest", "messages", "array"):
        tighten(branch, "maxItems", limits.max_batch_prompts)
    for branch in branches("BatchRequest", "messages", "array"):
        tighten(branch["items"], "maxItems", limits.max_messages)
    for model in ("ChatMessage", "CompletionRequest", "BatchRequest"):
        schema = schemas.get(model)
        if schema is not None:
            schema["description"] = (f"{schema.get('description', '').rstrip()} A prompt (all of its messages' text "
                                     f"together) is at most {limits.max_prompt_chars} characters.").lstrip()


def document_parts(schemas: Mapping[str, Any], *, allocators: Iterable[str], aggregators: Iterable[str],
                   verifiers: Iterable[str]) -> None:
    """Write the names this deployment's registries know (plugins included) into the OpenAPI component
    schemas of policy specs (``allocator``, ``aggregator``) and verifiers (``name``): another name is a 400.
    Their ``params`` stay free-form objects here: each allocator, verifier and answer kind validates its
    own."""
    policy = {"allocator": sorted(allocators), "aggregator": sorted(aggregators)}
    verifier = {"name": sorted(verifiers)}
    for schema in schemas.values():  # PolicySpec and the policy write bodies built on it; VerifierSpec
        properties = schema.get("properties", {})
        fields = policy if policy.keys() <= properties.keys() else verifier if schema.get("title") == "VerifierSpec" \
            else {}
        for field, enum in fields.items():
            for branch in properties[field].get("anyOf", [properties[field]]):
                if branch.get("type") == "string":
                    branch["enum"] = enum


Priority = Literal["latency", "tokens"]
"""``ttc.priority``: latency (samples start wide while the backends are idle) or tokens (never more samples
than the allocator asks for)."""

StopReason = Literal["policy", "cap", "no_answer", "no_agreement", "budget", "tokens", "deadline", "error"]
