"""A pool of OpenAI-compatible backends: least-outstanding balancing, timeouts, a circuit breaker, retries.

Each call goes to the healthy backend with the fewest calls in flight (ties: the one used least
recently). A call that fails for a backend reason is retried, up to ``max_retries`` times with
exponential backoff, on another backend: one that failed is avoided for ``cooldown_s`` while others can
serve (when none can, it is tried again). A connection failure or a timeout (no first token within
``first_token_timeout_s``, no token for ``token_timeout_s``, a non-streamed call past
``request_timeout_s``, a stream cut short) opens the backend's circuit at once for ``cooldown_s``: it
receives no calls at all; ``errors_to_open`` consecutive 5xx answers open it too (one transient 502
does not take a single backend out). Once the cool-down has passed the circuit is half-open: one call
at a time probes the backend (a success closes it, a failure opens it again), as do the periodic
health checks.
When no backend can take a call (every circuit open or probing, or every backend already failed this
call) the call fails at once with a 503 saying which backends are down and why, instead of waiting on
a backend known to be down. A 4xx is the request's fault: it is not retried and is reported to the
client as a 400 (or 404 for an unknown model).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence

from app.backends.base import Draw, DrawResult, Progress, SampleSource, SamplingRequest, StreamItem
from app.backends.http import TransportError
from app.backends.openai import BackendCallError, OpenAIBackend
from app.config import BackendPoolConfig
from app.errors import BackendError, BackendUnavailable, InvalidRequest, NotFound
from app.metrics import Metrics

log = logging.getLogger("ttc.backends")


class BackendPool(SampleSource):
    """Implements :class:`app.backends.base.SampleSource` over several backends."""

    def __init__(self, backends: Sequence[OpenAIBackend], config: BackendPoolConfig,
                 metrics: Metrics | None = None, capacity: int = 256) -> None:
        if not backends:
            raise ValueError("a backend pool needs at least one backend")
        self.backends = list(backends)
        self.config = config
        self.metrics = metrics
        self.capacity = capacity
        """Requests one backend runs at once at full load (vLLM's max_num_seqs, or what the operator says
        saturates it)."""
        self._last_used = {b.name: 0.0 for b in self.backends}
        self._cut_checked: dict[str, set[str]] = {}
        """Per backend, the models whose trace-cutting probe gave an answer (yes or no)."""
        self._health_task: asyncio.Task[None] | None = None
        self._load_task: asyncio.Task[None] | None = None

    def busy(self) -> float:
        """The pool's load as its vLLM servers last reported it (polled every ``load_interval_s``): per
        up backend ``1`` when requests wait, else ``max(running / capacity, KV-cache use)``; the mean
        over them (1 when none is up)."""
        shares = []
        for b in self.backends:
            if b.down_reason:
                continue
            load = b.last_load
            if load is None:
                shares.append(0.0)
            else:
                shares.append(1.0 if load.waiting > 0 else min(1.0, max(load.running / self.capacity, load.kv_cache)))
        value = sum(shares) / len(shares) if shares else 1.0
        if self.metrics is not None:
            self.metrics.backend_busy.set(value)
        return value

    def available(self, exclude: set[str] | None = None, *, avoided: bool = True,
                  model: str | None = None, cut: bool = False) -> list[OpenAIBackend]:
        """Backends whose circuit is closed, not in ``exclude`` (and, unless ``avoided``, not failed
        within their cool-down) that serve ``model`` (a backend that did not say what it serves serves
        anything) and, with ``cut``, whose engine cuts its traces (:meth:`OpenAIBackend.cuts`)."""
        now = time.monotonic()
        return [b for b in self.backends if not b.down_reason and b.name not in (exclude or set())
                and (avoided or b.avoid_until <= now) and self._serves(b, model, cut)]

    @staticmethod
    def _serves(b: OpenAIBackend, model: str | None, cut: bool) -> bool:
        if cut:
            return model is not None and b.cuts(model)
        return model is None or not b.models or model in b.models

    def why_not_cutting(self, model: str) -> str | None:
        """``None`` when some backend's engine cuts traces of ``model`` (up or not), else why none does,
        backend by backend: the refusal of a policy that needs it (README, "Trace monitors inside the
        engine")."""
        if any(b.cuts(model) for b in self.backends):
            return None
        reasons = [f"{b.name}: {b.cut_missing.get(model, 'not checked yet (it has not answered)')}"
                   for b in self.backends if not b.models or model in b.models]
        return (f"No backend serving {model} can cut traces inside its engine, which this policy needs (the "
                f"ttc_monitor vLLM plugin; README, \"Trace monitors inside the engine\"): "
                f"{'; '.join(reasons) or 'none serves it'}.")

    @contextlib.contextmanager
    def lease(self, tried: set[str], model: str | None = None, cut: bool = False) -> Iterator[OpenAIBackend]:
        """The backend for the next attempt of a call that already tried ``tried``: the least busy one
        with a closed circuit (one not tried yet first), else one whose cool-down has passed and that no
        other call is probing (half-open: this call is its probe); with ``cut``, among those whose
        engine cuts the model's traces. Raises :class:`BackendUnavailable` when there is none."""
        why = self.why_not_cutting(model) if cut and model is not None else None
        if why is not None:
            raise BackendUnavailable(why, code="monitor_unavailable")
        candidates = (self.available(tried, avoided=False, model=model, cut=cut)
                      or self.available(avoided=False, model=model, cut=cut)
                      or self.available(tried, model=model, cut=cut) or self.available(model=model, cut=cut))
        probe = None
        if candidates:
            backend = min(candidates, key=lambda b: (b.outstanding, self._last_used[b.name]))
        else:
            now = time.monotonic()
            due = [b for b in self.backends if b.name not in tried and b.down_until <= now and not b.probing
                   and self._serves(b, model, cut)]
            if not due:
                raise BackendUnavailable(self._down_message(tried))
            backend = probe = min(due, key=lambda b: b.down_until)
            probe.probing = True
        self._last_used[backend.name] = time.monotonic()
        tried.add(backend.name)
        try:
            yield backend
        finally:
            if probe is not None:
                probe.probing = False

    def _down_message(self, tried: set[str]) -> str:
        now = time.monotonic()
        parts = []
        for b in self.backends:
            if b.name in tried and not b.down_reason:
                parts.append(f"{b.name} failed this request")
            elif b.down_reason:
                left = max(0.0, b.down_until - now)
                when = f"probed again in {left:.0f}s" if left > 0 else "being probed"
                parts.append(f"{b.name} is down ({b.down_reason}; {when})")
        return "No backend can serve the request now: " + "; ".join(parts) + "."

    def mark_down(self, backend: OpenAIBackend, reason: str) -> None:
        """Open the backend's circuit for ``cooldown_s``."""
        backend.down_until = backend.avoid_until = time.monotonic() + self.config.cooldown_s
        backend.down_reason = reason
        log.warning("backend %s taken out for %.1fs: %s", backend.name, self.config.cooldown_s, reason)

    def mark_up(self, backend: OpenAIBackend) -> None:
        if backend.down_reason:
            log.info("backend %s is back", backend.name)
        backend.down_until = backend.avoid_until = 0.0
        backend.down_reason = ""
        backend.errors = 0

    async def draw(self, request: SamplingRequest, n: int, *, seed: int | None = None,
                   max_tokens: int | None = None) -> DrawResult:
        """One ``n=k`` call on the best backend; on a backend fault, up to ``max_retries`` more on others."""
        tried: set[str] = set()
        attempts = 0
        while True:
            attempts += 1
            with self.lease(tried, request.model, request.cut is not None) as backend:
                try:
                    result = await backend.draw(request, n, seed=seed, max_tokens=max_tokens)
                except BackendCallError as exc:
                    self._record_error(backend, exc)
                    self._give_up(exc, attempts)
                else:
                    self.mark_up(backend)
                    self._observe(backend, result.latency_s)
                    if log.isEnabledFor(logging.DEBUG):
                        log.debug("backend %s: %s n=%d in %.1f ms", backend.name, request.kind, n,
                                  result.latency_s * 1000)
                    return result
            await asyncio.sleep(self._backoff(attempts))

    async def stream(self, request: SamplingRequest, n: int, progress: Progress, *, seed: int | None = None,
                     max_tokens: int | None = None) -> AsyncIterator[StreamItem]:
        """``n`` samples as one streamed call on the best backend. A backend that fails mid-stream
        (connection lost, a stall, a 5xx, a stream cut short) is taken out and the samples it had not
        finished are asked of another one, up to ``max_retries`` times; samples already yielded stand,
        and the failed attempt's unfinished tokens are not billed (``progress`` restarts)."""
        tried: set[str] = set()
        left, attempts = n, 0
        while True:
            attempts += 1
            with self.lease(tried, request.model, request.cut is not None) as backend:
                start = time.perf_counter()
                try:
                    async for item in backend.stream(request, left, progress, seed=seed, max_tokens=max_tokens):
                        if isinstance(item, Draw):
                            left -= 1
                        yield item
                except BackendCallError as exc:
                    self._record_error(backend, exc)
                    self._give_up(exc, attempts)
                    if not progress.restart():
                        raise BackendUnavailable(f"Backend {backend.name} failed after part of the answer was "
                                                 f"streamed to the client: {exc}") from None
                else:
                    self.mark_up(backend)
                    self._observe(backend, time.perf_counter() - start)
                    return
            await asyncio.sleep(self._backoff(attempts))

    def _give_up(self, exc: BackendCallError, attempts: int) -> None:
        """Raise the client's error when ``exc`` is not worth another attempt."""
        if not exc.retryable:
            raise _client_error(exc) from None
        if attempts > self.config.max_retries:
            raise BackendUnavailable(f"No backend could serve the request after {attempts} attempt(s); the last "
                                     f"failed: {exc}") from None

    def _backoff(self, attempts: int) -> float:
        return min(2.0, self.config.retry_backoff_s * 2 ** (attempts - 1))

    def _observe(self, backend: OpenAIBackend, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.backend_latency.labels(backend.name).observe(seconds)

    def _record_error(self, backend: OpenAIBackend, exc: BackendCallError) -> None:
        kind = "status_" + str(exc.status) if exc.status else "connection"
        if self.metrics is not None:
            self.metrics.backend_errors.labels(backend.name, kind).inc()
        if not exc.retryable:
            return
        backend.errors += 1
        backend.avoid_until = time.monotonic() + self.config.cooldown_s
        hard = exc.status is None and not exc.dropped  # refused, timed out: the server is not there
        if hard or backend.errors >= self.config.errors_to_open or backend.down_reason:
            self.mark_down(backend, str(exc))

    async def check_all(self) -> None:
        """Probe every backend: one failing ``health_failures_to_open`` checks in a row is taken out
        (again; a busy server can miss one check's timeout while it serves, and its calls say more),
        one that answers after its cool-down is back."""
        results = await asyncio.gather(*(b.check_health() for b in self.backends))
        now = time.monotonic()
        for backend, ok in zip(self.backends, results, strict=True):
            backend.health_failures = 0 if ok else backend.health_failures + 1
            if backend.health_failures >= self.config.health_failures_to_open and backend.down_until <= now:
                self.mark_down(backend, f"{backend.health_failures} health checks failed in a row")
            elif ok and backend.down_until <= now:
                self.mark_up(backend)
            if ok and not backend.models:
                with contextlib.suppress(TransportError, ValueError, KeyError):
                    await backend.list_models()
            if ok:
                for model in backend.models:
                    if model not in backend.cut_markers and model not in self._cut_checked.get(backend.name, ()):
                        await self._probe_cut(backend, model)

    async def _probe_cut(self, backend: OpenAIBackend, model: str) -> None:
        """Whether ``backend`` cuts traces of ``model`` (asked when it first answers, until the probe
        gives an answer; logged)."""
        found = await backend.probe_cut(model)
        if found is None:
            return
        self._cut_checked.setdefault(backend.name, set()).add(model)
        if found:
            log.info("backend %s cuts traces of %s inside its engine (marker token %d)", backend.name, model,
                     backend.cut_markers[model])
        else:
            log.warning("backend %s cannot cut traces of %s inside its engine, so policies that monitor traces "
                        "(deepconf) are refused for it: %s", backend.name, model, backend.cut_missing[model])

    async def ready(self) -> bool:
        """True when at least one backend answers its health check now."""
        results = await asyncio.gather(*(b.check_health() for b in self.backends))
        return any(results)

    def start_health_checks(self) -> None:
        """Health checks every ``health_interval_s``; the servers' load every ``load_interval_s``."""
        async def health() -> None:
            while True:
                with contextlib.suppress(Exception):
                    await self.check_all()
                await asyncio.sleep(self.config.health_interval_s)

        async def load() -> None:
            while True:
                for b, found in zip(self.backends, await asyncio.gather(
                        *(b.load() for b in self.backends), return_exceptions=True), strict=True):
                    b.last_load = found if not isinstance(found, BaseException) else None
                await asyncio.sleep(self.config.load_interval_s)

        self._health_task = asyncio.create_task(health(), name="ttc-health-checks")
        self._load_task = asyncio.create_task(load(), name="ttc-load-polls")

    async def stop(self) -> None:
        for task in (self._health_task, self._load_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

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

    def __init__(self, source: SampleSource, configured: Sequence[str] = (),
                 max_tokens: Mapping[str, int] | None = None) -> None:
        self.source = source
        self.configured = list(configured)
        self.max_tokens: Mapping[str, int] = max_tokens or {}
        """Per model, the ``max_tokens`` of requests that set none (its engine's ``default_max_tokens``)."""

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
