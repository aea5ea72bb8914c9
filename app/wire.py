"""Wire models: the OpenAI request bodies we accept and the ``ttc`` extension object.

Top-level OpenAI fields we do not use are ignored (as an OpenAI-compatible server should); the
``ttc`` object is strict (``extra="forbid"``) so a typo in it is a 400 naming the field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.answers.kinds import AnswerSpec


class VerifierSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    params: dict[str, Any] = Field(default_factory=dict)


class PolicySpec(BaseModel):
    """An allocation policy: allocator + params, aggregator, optional verifier, budget defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    allocator: str
    params: dict[str, Any] = Field(default_factory=dict)
    aggregator: str = "majority"
    verifier: VerifierSpec | None = None
    answer: AnswerSpec | None = Field(None, description="How answers are extracted and compared (default: auto)")
    budget: BudgetSpec | None = None
    record: bool | None = Field(None, description="Record served samples (None: the service's recording.enabled)")

    @model_validator(mode="before")
    @classmethod
    def _verifier_shorthand(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("verifier"), str):
            data = {**data, "verifier": {"name": data["verifier"]}}
        return data


class BudgetSpec(BaseModel):
    """Limits of one request: samples per query, completion tokens in total, wall-clock deadline."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    max_samples: int | None = Field(None, ge=1, description="Most samples drawn for the query")
    max_tokens: int | None = Field(None, ge=1, description="Most completion tokens over all samples")
    deadline_ms: int | None = Field(None, ge=1, le=3_600_000, description="Wall-clock limit")


PolicySpec.model_rebuild()


class TTCOptions(BaseModel):
    """The ``ttc`` extension object of a request (sent by the OpenAI SDK through ``extra_body``)."""

    model_config = ConfigDict(extra="forbid")
    policy: str | PolicySpec | None = None
    budget: BudgetSpec | None = None
    answer: AnswerSpec | None = Field(None, description="Answer kind for this request (overrides the policy's)")
    return_samples: bool = False
    partial_on_deadline: bool = False
    reference: str | None = Field(None, description="Reference answer for the `reference` verifier")


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class _SamplingFields(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    n: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    user: str | None = None
    # vLLM sampling extras, passed through when set
    top_k: int | None = None
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0)
    min_tokens: int | None = Field(None, ge=0)
    ignore_eos: bool | None = None
    ttc: TTCOptions | None = None

    def sampling_params(self) -> dict[str, Any]:
        """The OpenAI sampling fields forwarded to the backend (None values dropped)."""
        keys = ("temperature", "top_p", "max_tokens", "stop", "presence_penalty", "frequency_penalty",
                "top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos")
        return {k: getattr(self, k) for k in keys if getattr(self, k) is not None}


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None

    def sampling_params(self) -> dict[str, Any]:
        out = super().sampling_params()
        if self.max_completion_tokens is not None and "max_tokens" not in out:
            out["max_tokens"] = self.max_completion_tokens
        return out


class CompletionRequest(_SamplingFields):
    prompt: str | list[str]
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False


StopReason = Literal["policy", "cap", "budget", "tokens", "deadline", "error"]
