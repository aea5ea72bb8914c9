"""Types shared by every sample source (a live OpenAI-compatible backend, the replay backend).

A *sample source* answers one question: draw ``n`` samples for one prompt, in one call, and say
what each sample was and what it cost. The engine loop only talks to this protocol, so live
traffic and offline replay run the same code.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol


@dataclass(slots=True)
class Usage:
    """Token usage, summed the OpenAI way; ``reasoning_tokens`` are the thought tokens among the
    completion tokens (reasoning models)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def add(self, other: Usage) -> None:
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.reasoning_tokens += other.reasoning_tokens

    def as_dict(self) -> dict[str, int]:
        """The OpenAI ``usage`` object."""
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.total_tokens}


@dataclass(slots=True)
class Draw:
    """One generated sample.

    ``text`` is its final content (what answers are extracted from), ``reasoning`` the thought a
    reasoning model wrote before it (vLLM's ``reasoning`` field, ``reasoning_content`` on older
    servers: ``reasoning_field`` says which name the backend used), ``tokens`` all its completion
    tokens, the ``reasoning_tokens`` of the thought among them, ``logprob`` the mean token
    log-probability and ``min_logprob`` the lowest one (when asked), ``logprobs`` the backend's log-prob
    object of the choice as it came (returned to a client that asked), ``tool_calls`` the choice's tool
    calls (chat). Recorded (replay) samples may carry their extracted ``answer``, ground-truth
    ``correct`` and a recorded reward-model ``score``; live samples leave them ``None``.
    """

    text: str
    finish_reason: str | None = None
    tokens: int = 0
    logprob: float | None = None
    min_logprob: float | None = None
    answer: str | None = None
    correct: bool | None = None
    score: float | None = None
    logprobs: Any = None
    tool_calls: list[dict[str, Any]] | None = None
    reasoning: str | None = None
    reasoning_tokens: int = 0
    reasoning_field: str | None = None
    stop_reason: str | int | None = None
    """vLLM's ``stop_reason``: the stop string (or token id) that ended the sample, ``None`` for its end
    token (a step of a search ends at its delimiter; a solution, at the end token)."""


REASONING_FIELDS = ("reasoning", "reasoning_content")
"""Where a backend puts a reasoning model's thought: vLLM's name, then the older one (both are seen)."""


@dataclass(frozen=True, slots=True)
class TraceCut:
    """A trace monitor inside the engine (DeepConf's online cut, the ``ttc_monitor`` vLLM plugin): every
    sample of the call is ended at its first token whose sliding-window group confidence over
    ``window`` tokens (each token's confidence over its ``top_k`` most likely alternatives) is under
    ``threshold``; such a sample comes back with ``finish_reason: "cut"``. ``threshold`` ``None``: not
    known yet (a query's warmup), the samples run whole, on an engine that cuts like the query's others."""

    window: int
    top_k: int
    threshold: float | None


@dataclass(slots=True)
class SamplingRequest:
    """What to sample: a chat (``messages``) or a completion (``prompt``) plus sampling params.

    ``params`` holds the OpenAI sampling fields passed through to the backend (temperature, top_p,
    max_tokens, stop, logprobs, ...). ``query_id`` lets a replay source find recorded samples. ``cut``
    asks for the engine's trace monitor.
    """

    kind: Literal["chat", "completion"]
    model: str
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    query_id: str | None = None
    cut: TraceCut | None = None
    """Cut low-confidence samples inside the engine (a backend with the monitor; see :class:`TraceCut`)."""

    def prompt_text(self) -> str:
        """The prompt as plain text (for verifiers, features and recording)."""
        if self.kind == "completion":
            return self.prompt or ""
        parts = []
        for m in self.messages or []:
            content = m.get("content")
            if isinstance(content, list):
                content = " ".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
            parts.append(str(content or ""))
        return "\n".join(parts)


@dataclass(slots=True)
class DrawResult:
    """The samples of one call, what the call cost and who served it."""

    draws: list[Draw]
    usage: Usage
    backend: str = ""
    latency_s: float = 0.0


@dataclass(slots=True)
class Progress:
    """What a streamed call has produced for its samples not delivered yet, updated as chunks arrive.

    ``tokens``: completion tokens received for the samples still running (a sample's tokens move
    into its :class:`Draw` when it finishes). When the engine cancels the call it bills ``tokens`` and
    ``unseen``: vLLM may have generated a few more that were still in the socket, which nobody can
    see. A call retried on another backend after a failure mid-stream starts again from zero
    (:meth:`restart`): the failed attempt is not billed, as a failed ``n=k`` call is not.

    ``on_thought`` (one-sample calls): called with each piece of
    thought and the thought's tokens so far (a trace's probes, :mod:`app.probes`); once ``verdict`` is
    set the sample is stopped at its next chunk, its stream closed, and it is yielded with its thought
    so far, ``verdict`` as its content and ``finish_reason: "probe"``. ``done``: the one sample
    finished. ``on_text`` (one-sample calls): called with each piece of text (and of
    thought: its second argument is ``True``) as it arrives (the service passes them on to a streaming
    client); once it has been called, the call cannot be retried elsewhere (the client holds part of
    this sample).
    """

    tokens: int = 0
    reasoning_tokens: int = 0
    """Of ``tokens``, those of the unfinished samples' thoughts."""
    unseen: Callable[[], int] | None = None
    """Tokens the unfinished samples have likely generated since the backend last reported them (a
    stream whose events come every ``stream_interval`` tokens; see
    :meth:`~app.backends.openai.StreamAccumulator.unseen`): billed with ``tokens`` when the call is
    cancelled."""
    prompt_tokens: int = 0
    """The call's prompt tokens, as soon as the backend has said (vLLM's continuous usage statistics:
    every chunk carries the running totals); billed when the call is cancelled before its end."""
    sent: bool = False
    """The call was sent (a call cancelled before it was costs nothing)."""
    on_text: Callable[[str, bool], None] | None = None
    emitted: bool = False
    on_thought: Callable[[str, int], None] | None = None
    verdict: str | None = None
    done: bool = False

    @property
    def per_token(self) -> bool:
        """Someone follows the call token by token (its text relayed, its thought probed): it must be
        streamed one event per token; else the backend may batch its events."""
        return self.on_text is not None or self.on_thought is not None

    def restart(self) -> bool:
        """Start over for another attempt; ``False`` when text was already passed on (no retry)."""
        self.tokens = 0
        self.reasoning_tokens = 0
        self.prompt_tokens = 0
        self.unseen = None
        return not self.emitted


StreamItem = Draw | Usage
"""What a streamed call yields: each sample as it finishes (a :class:`Draw`, its own ``tokens``
set), then one :class:`Usage`: the call's prompt tokens and the completion tokens not already in a
yielded draw (the exact total may differ a little from the per-sample counts)."""


class SampleSource(Protocol):
    """Anything that can draw ``n`` samples of one prompt in one call.

    ``inline``: draws complete without waiting on I/O (replay), so the engine awaits them one by one;
    ``models()``: the model names it serves (may be empty: unknown); ``ready()``: whether it can
    serve now. Subclass it to inherit the defaults."""

    inline: bool = False

    def models(self) -> list[str]:
        return []

    def busy(self) -> float:
        """How busy the backends are, 0 (idle) to 1 (saturated), as they last reported it (default 0:
        a source that cannot tell)."""
        return 0.0

    async def ready(self) -> bool:
        return True

    def why_not_cutting(self, model: str) -> str | None:
        """Why no backend serving ``model`` can cut traces inside its engine (``SamplingRequest.cut``),
        ``None`` when one can (default: none can, it cannot tell)."""
        return "this sample source cannot cut traces"

    async def draw(
        self, request: SamplingRequest, n: int, *, seed: int | None = None, max_tokens: int | None = None
    ) -> DrawResult:
        """Draw ``n`` samples. ``seed`` (when set) makes the draw reproducible; ``max_tokens``
        overrides the request's per-sample token limit (the engine shrinks it to fit a token budget).
        Raises :class:`app.errors.BackendUnavailable` when no backend could serve the call."""
        ...

    def stream(
        self, request: SamplingRequest, n: int, progress: Progress, *, seed: int | None = None,
        max_tokens: int | None = None,
    ) -> AsyncIterator[StreamItem]:
        """Draw ``n`` samples in one streamed call: yield each as it finishes, then the call's
        :class:`Usage` (see :data:`StreamItem`), keeping ``progress`` current. Closing the iterator
        (or cancelling its consumer) closes the stream: the backend aborts what was still running.
        Default: one ``n``-sample :meth:`draw`, its samples yielded in order."""
        return _drawn_stream(self, request, n, seed, max_tokens)


async def _drawn_stream(source: SampleSource, request: SamplingRequest, n: int, seed: int | None,
                        max_tokens: int | None) -> AsyncIterator[StreamItem]:
    result = await source.draw(request, n, seed=seed, max_tokens=max_tokens)
    for draw in result.draws:
        yield draw
    yield Usage(result.usage.prompt_tokens, result.usage.completion_tokens - sum(d.tokens for d in result.draws),
                result.usage.reasoning_tokens - sum(d.reasoning_tokens for d in result.draws))
