"""A pool of OpenAI-compatible backends: least-outstanding balancing, health, cool-down, retries.

Each call goes to the healthy backend with the fewest calls in flight (ties: the one used least
recently). A backend whose call fails for a backend reason (connection error, timeout, 5xx) is
taken out for ``cooldown_s`` and the call is retried on another one, up to ``max_retries`` times
with exponential backoff (tenacity). When every backend is cooling off, a call still tries the one
whose cool-down ends first rather than being refused: one transient error on a single-backend
deployment must not fail every request for the whole cool-down. A 4xx is the request's fault: it is
not retried and is reported to the client as a 400 (or 404 for an unknown model).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence

from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from app.backends.base import Draw, DrawResult, Progress, SampleSource, SamplingRequest, StreamItem
from app.backends.http import TransportError
from app.backends.openai import BackendCallError, OpenAIBackend
from app.config import BackendPoolConfig
from app.errors import BackendError, BackendUnavailable, InvalidRequest, NotFound
from app.metrics import Metrics

log = logging.getLogger("ttc.backends")


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, BackendCallError) and exc.retryable


class BackendPool(SampleSource):
    """Implements :class:`app.backends.base.SampleSource` over several backends."""

    def __init__(self, backends: Sequence[OpenAIBackend], config: BackendPoolConfig,
                 metrics: Metrics | None = None) -> None:
        if not backends:
            raise ValueError("a backend pool needs at least one backend")
        self.backends = list(backends)
        self.config = config
        self.metrics = metrics
        self._last_used = {b.name: 0.0 for b in self.backends}
        self._health_task: asyncio.Task[None] | None = None

    def available(self, exclude: set[str] | None = None) -> list[OpenAIBackend]:
        now = time.monotonic()
        return [b for b in self.backends if b.down_until <= now and b.name not in (exclude or set())]

    def pick(self, exclude: set[str]) -> OpenAIBackend | None:
        candidates = self.available(exclude)
        if not candidates:
            return None
        best = min(candidates, key=lambda b: (b.outstanding, self._last_used[b.name]))
        self._last_used[best.name] = time.monotonic()
        return best

    def soonest_back(self) -> OpenAIBackend:
        """Every backend is cooling off: the one whose cool-down ends first."""
        return min(self.backends, key=lambda b: b.down_until)

    def mark_down(self, backend: OpenAIBackend, reason: str) -> None:
        backend.down_until = time.monotonic() + self.config.cooldown_s
        log.warning("backend %s taken out for %.1fs: %s", backend.name, self.config.cooldown_s, reason)

    async def draw(self, request: SamplingRequest, n: int, *, seed: int | None = None,
                   max_tokens: int | None = None) -> DrawResult:
        """One call on the best backend; on a backend fault, up to ``max_retries`` more on others
        (tenacity, exponential backoff). The first attempt runs outside tenacity: its retry state is
        cyclic garbage, and building it for every call (most need no retry) cost the event loop
        collector pauses under load."""
        tried: set[str] = set()
        try:
            try:
                return await self._attempt(request, n, seed, max_tokens, tried)
            except BackendCallError as exc:
                if not exc.retryable or self.config.max_retries == 0:
                    raise
            await asyncio.sleep(self.config.retry_backoff_s)
            retrying = AsyncRetrying(
                stop=stop_after_attempt(self.config.max_retries),
                wait=wait_exponential(multiplier=self.config.retry_backoff_s * 2, max=2.0),
                retry=retry_if_exception(_retryable),
                reraise=True,
            )
            async for attempt in retrying:
                with attempt:
                    return await self._attempt(request, n, seed, max_tokens, tried)
        except BackendCallError as exc:
            if exc.retryable:
                raise BackendUnavailable(
                    f"No backend could serve the request after {len(tried)} attempt(s): {exc}"
                ) from None
            raise _client_error(exc) from None
        raise AssertionError("unreachable")  # pragma: no cover

    async def stream(self, request: SamplingRequest, n: int, progress: Progress, *, seed: int | None = None,
                     max_tokens: int | None = None) -> AsyncIterator[StreamItem]:
        """``n`` samples as one streamed call on the best backend. A backend that fails mid-stream
        (connection lost, 5xx, a stream cut short) is taken out and the samples it had not finished
        are asked of another one, up to ``max_retries`` times; samples already yielded stand, and the
        failed attempt's unfinished tokens are not billed (``progress`` restarts)."""
        tried: set[str] = set()
        left = n
        for attempt in range(self.config.max_retries + 1):
            backend = self.pick(tried) or self.pick(set()) or self.soonest_back()
            tried.add(backend.name)
            start = time.perf_counter()
            try:
                async for item in backend.stream(request, left, progress, seed=seed, max_tokens=max_tokens,
                                                 timeout_s=self.config.request_timeout_s):
                    if isinstance(item, Draw):
                        left -= 1
                    yield item
                if self.metrics is not None:
                    self.metrics.backend_latency.labels(backend.name).observe(time.perf_counter() - start)
                return
            except BackendCallError as exc:
                self._record_error(backend, exc)
                if not exc.retryable:
                    raise _client_error(exc) from None
                if attempt == self.config.max_retries:
                    raise BackendUnavailable(
                        f"No backend could serve the request after {len(tried)} attempt(s): {exc}") from None
                if not progress.restart():
                    raise BackendUnavailable(
                        f"Backend {backend.name} failed after part of the answer was streamed to the client: {exc}"
                    ) from None
                await asyncio.sleep(min(2.0, self.config.retry_backoff_s * 2**attempt))

    async def _attempt(self, request: SamplingRequest, n: int, seed: int | None, max_tokens: int | None,
                       tried: set[str]) -> DrawResult:
        backend = self.pick(tried) or self.pick(set()) or self.soonest_back()
        tried.add(backend.name)
        try:
            result = await backend.draw(request, n, seed=seed, max_tokens=max_tokens,
                                        timeout_s=self.config.request_timeout_s)
        except BackendCallError as exc:
            self._record_error(backend, exc)
            raise
        if self.metrics is not None:
            self.metrics.backend_latency.labels(backend.name).observe(result.latency_s)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("backend %s: %s n=%d in %.1f ms", backend.name, request.kind, n, result.latency_s * 1000)
        return result

    def _record_error(self, backend: OpenAIBackend, exc: BackendCallError) -> None:
        kind = "status_" + str(exc.status) if exc.status else "connection"
        if self.metrics is not None:
            self.metrics.backend_errors.labels(backend.name, kind).inc()
        if exc.retryable:
            self.mark_down(backend, str(exc))

    async def check_all(self) -> None:
        """Probe every backend; a failing one is taken out, a recovered one is back after its cool-down."""
        results = await asyncio.gather(*(b.check_health() for b in self.backends))
        for backend, ok in zip(self.backends, results, strict=True):
            if not ok and backend.down_until <= time.monotonic():
                self.mark_down(backend, "health check failed")
            elif ok and not backend.models:
                with contextlib.suppress(TransportError, ValueError, KeyError):
                    await backend.list_models()

    async def ready(self) -> bool:
        """True when at least one backend answers its health check now."""
        results = await asyncio.gather(*(b.check_health() for b in self.backends))
        return any(results)

    def start_health_checks(self) -> None:
        async def loop() -> None:
            while True:
                with contextlib.suppress(Exception):
                    await self.check_all()
                await asyncio.sleep(self.config.health_interval_s)

        self._health_task = asyncio.create_task(loop(), name="ttc-health-checks")

    async def stop(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task

    def models(self) -> list[str]:
        seen: dict[str, None] = {}
        for b in self.backends:
            for m in b.models:
                seen.setdefault(m, None)
        return list(seen)


def _client_error(exc: BackendCallError) -> Exception:
    message = str(exc)
    param = None
    body = exc.body
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            message = str(err.get("message") or message)
            param = err.get("param")
        elif isinstance(body.get("message"), str):
            message = body["message"]
    if exc.status == 404:
        return NotFound(f"Backend says: {message}", param=param or "model", code="model_not_found")
    if exc.status in (400, 413, 422):
        return InvalidRequest(f"Backend rejected the request: {message}", param=param)
    return BackendError(f"Backend error {exc.status}: {message}")


class ModelCatalog:
    """The model names this service answers for: ``configured`` (the config's default model, the
    embedded engine's served name) then every backend's own (empty: the backends did not say)."""

    def __init__(self, source: SampleSource, configured: Sequence[str] = ()) -> None:
        self.source = source
        self.configured = list(configured)

    def names(self) -> list[str]:
        return list(dict.fromkeys([*self.configured, *self.source.models()]))

    def check(self, model: str | None) -> str:
        """``model`` (default: the first known name); 404 naming ``model`` when no backend serves it,
        400 when none was given and none is known."""
        known = self.names()
        model = model or (known[0] if known else None)
        if not model:
            raise InvalidRequest("No model given and the service has no default model.", param="model")
        if known and model not in known:
            raise NotFound(f"The model {model!r} does not exist; this service serves: {', '.join(known)}.",
                           param="model", code="model_not_found")
        return model
