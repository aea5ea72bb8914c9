"""The application factory. Nothing is built at import time: ``create_app(settings)`` does it all,
and the lifespan owns every resource (store, Redis, HTTP clients, backend pool or embedded engine,
answer workers, sandbox, recorder); :func:`build_state` wires them into the one :class:`AppState`."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib.util
import logging
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from allocators import available as available_allocators
from app.aggregators import builtin_aggregators
from app.answers import AnswerRuntime, ParsePool
from app.auth import Authenticator
from app.backends.base import SampleSource
from app.backends.http import BackendHTTP, open_backend_http
from app.backends.launcher import EngineSet
from app.backends.openai import OpenAIBackend, Timeouts
from app.backends.pool import BackendPool, ModelCatalog
from app.batches import BatchManager
from app.code.runner import CodeRunner
from app.config import LimitsConfig, Settings
from app.deps import ReaderDep
from app.engine import Engine
from app.handlers import install_error_handlers
from app.metrics import Metrics
from app.middleware import EdgeMiddleware
from app.policy import PartsCache
from app.prepare import Preparer
from app.protocol import ErrorEnvelope, JSONBytes, request_schemas
from app.protocol.requests import document_limits, document_parts
from app.ratelimit import MemoryBuckets, RateLimiter, RedisBuckets
from app.recording import Recorder
from app.routes import batches, inference, keys, policies, stats, system, ui
from app.runner import Runner
from app.sandbox import Sandbox
from app.serving import OpenAIServing
from app.shared_stats import SharedLearning
from app.state import Admin, AppState
from app.store import open_store
from app.store.policies import StorePolicies, spec_json, sync_declared
from app.verifiers import builtin_verifiers

log = logging.getLogger("ttc")
COMMON_ERRORS = {400: "Invalid request: the envelope's param names the field", 401: "Missing or invalid API key",
                 403: "The key may not do this", 404: "No such resource", 409: "Conflict with the stored state",
                 413: "Request body too large"}


@dataclasses.dataclass(frozen=True)
class Sources:
    """What the backends are: the sample source, the named endpoints verifiers reach (``embedded:NAME``),
    each model's default ``max_tokens``, and the embedded engines when the service started them."""

    source: SampleSource
    endpoints: dict[str, str]
    max_tokens: dict[str, int]
    engines: EngineSet | None = None


@contextlib.asynccontextmanager
async def open_source(settings: Settings, http: BackendHTTP, metrics: Metrics,
                      engine_log: Path | None) -> AsyncIterator[Sources]:
    """The backend pool over the configured backends, or over the embedded vLLM engines started here
    when none is configured (stopped on exit): ``engine`` and ``extra_engines``, generators as backends
    (each serving its own model), pooling models as endpoints."""
    max_tokens = settings.limits.default_max_tokens
    pool = settings.pool
    timeouts = Timeouts(pool.request_timeout_s, pool.first_token_timeout_s, pool.token_timeout_s, pool.stream_timeout_s)
    engines = None
    endpoints = dict(settings.endpoints)
    defaults: dict[str, int] = {}
    if settings.backends:
        backends = [OpenAIBackend(b.url, http, name=b.name or b.url, api_key=b.api_key,
                                  serialize_seeded=b.serialize_seeded, default_max_tokens=max_tokens,
                                  timeouts=timeouts, continuous_usage=b.continuous_usage,
                                  stream_interval=pool.stream_interval, cut_marker=b.cut_marker)
                    for b in settings.backends]
    else:
        engines = EngineSet([settings.engine, *settings.extra_engines],
                            engine_log.parent if engine_log else None, engine_log)
        engines.start()
        await engines.wait_ready()
        backends = [OpenAIBackend(e.url, http, name=e.cfg.served_model_name, timeouts=timeouts,
                                  default_max_tokens=e.cfg.default_max_tokens or max_tokens,
                                  models=[e.cfg.served_model_name], stream_interval=pool.stream_interval)
                    for e in engines.generators()]
        endpoints.update(engines.endpoints())
        defaults = {e.cfg.served_model_name: e.cfg.default_max_tokens for e in engines.generators()
                    if e.cfg.default_max_tokens}
    per_backend = settings.limits.stream_capacity // len(backends) if settings.limits.stream_capacity else 256
    source = BackendPool(backends, settings.pool, metrics, capacity=max(1, per_backend))
    try:
        await source.check_all()
        source.start_health_checks()
        yield Sources(source, endpoints, defaults, engines)
    finally:
        await source.stop()
        if engines is not None:
            engines.stop()


def build_state(settings: Settings, *, store: Any, redis: Any, http: httpx.AsyncClient, sources: Sources,
                metrics: Metrics, recorder: Recorder, parse_pool: ParsePool) -> AppState:
    """Wire every part of the service into its :class:`AppState` (the one place this happens)."""
    code = CodeRunner(Sandbox(settings.sandbox))
    answers = AnswerRuntime(parse_pool, code=code, max_compare=settings.answers.max_compare)
    source = sources.source
    capacity = settings.limits.stream_capacity or 256 * max(1, len(settings.backends))
    engine = Engine(source, http, settings.limits.default_max_tokens, answers,
                    max_in_flight=settings.limits.max_in_flight, capacity=capacity,
                    gauges=(metrics.sampling_width, metrics.stream_in_flight), endpoints=sources.endpoints)
    limiter = RateLimiter(RedisBuckets(redis, settings.redis.prefix) if redis else MemoryBuckets())
    shared = SharedLearning(redis, settings.redis.prefix, maxlen=settings.redis.learn_maxlen,
                            snapshot_every=settings.redis.learn_snapshot_every) if redis else None
    runner = Runner(engine, metrics, limiter=limiter, recorder=recorder, shared=shared)
    policies_ = StorePolicies(store, ttl_s=settings.store.cache_ttl_s)
    embedded = sources.engines is not None
    configured = [n for n in (settings.default_model, embedded and settings.engine.served_model_name) if n]
    catalog = ModelCatalog(source, configured, sources.max_tokens)
    preparer = Preparer(policies_, PartsCache(seed=settings.seed), settings.limits, catalog,
                        default_max_tokens=settings.limits.default_max_tokens, shared=shared, rng=random.Random(),
                        stream_policy=settings.default_stream_policy,
                        effort_budgets=settings.reasoning.effort_budgets)
    auth = Authenticator(settings.auth, store, ttl_s=settings.store.cache_ttl_s)
    return AppState(
        settings=settings, http=http, source=source, catalog=catalog, engine=engine, preparer=preparer,
        runner=runner, serving=OpenAIServing(preparer, runner), metrics=metrics, policies=policies_,
        batches=BatchManager(runner, preparer, store.batches, settings.batches,
                             background=settings.workers == 1 or not store.db.memory),
        parse_pool=parse_pool, store=store,
        admin=Admin(store, policies_, auth, preparer, settings.default_policy),
        auth=auth, limiter=limiter, recorder=recorder, engines=sources.engines, redis=redis,
    )


def create_app(
    settings: Settings,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    source: SampleSource | None = None,
    engine_log: Path | None = None,
    tune_gc: bool = False,
) -> FastAPI:
    """Build the service. ``transport`` replaces the network for backend calls (tests);
    ``source`` replaces the backend pool altogether (replay, tests); ``tune_gc`` (``ttc serve``)
    freezes everything built at start-up out of the garbage collector's reach and makes young
    collections rarer: full collections of the start-up heap paused the event loop for 50-300 ms
    under load (the p99 stall).

    Start-up also opens the store (``store.url``, SQLite under ``store.data_dir`` by default), runs
    its migrations, loads built-in and config-declared policies into it (see
    :mod:`app.store.policies` for how conflicts resolve) and connects to Redis when configured."""
    for name, data in settings.policies.items():  # fail fast on a bad config, before any I/O
        spec_json({k: v for k, v in data.items() if k != "description"}, f"policies.{name}")

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            store = await open_store(settings.store.resolved_url(), echo=settings.store.echo)
            stack.push_async_callback(store.db.close)
            await sync_declared(store, settings)
            redis = None
            if settings.redis.url:
                import redis.asyncio as aioredis

                redis = aioredis.from_url(settings.redis.url)
                stack.push_async_callback(redis.aclose)
            recorder = Recorder(store, settings.recording)
            recorder.start()
            stack.push_async_callback(recorder.close)
            metrics = Metrics()
            timeout = httpx.Timeout(settings.pool.request_timeout_s, connect=settings.pool.connect_timeout_s)
            http = await stack.enter_async_context(httpx.AsyncClient(transport=transport, timeout=timeout))
            backend_http = await stack.enter_async_context(
                open_backend_http(settings.pool.max_connections, settings.pool.connect_timeout_s, transport=transport))
            if source is None:
                sources = await stack.enter_async_context(open_source(settings, backend_http, metrics, engine_log))
            else:
                sources = Sources(source, dict(settings.endpoints), {})
            cfg = settings.answers
            parse_pool = ParsePool(cfg.workers, cfg.timeout_s, cfg.max_pending,
                                   on_fallback=lambda reason: metrics.answer_fallbacks.labels(reason).inc())
            stack.callback(parse_pool.close)
            if cfg.prestart:
                parse_pool.start()
            state = build_state(settings, store=store, redis=redis, http=http, sources=sources,
                                metrics=metrics, recorder=recorder, parse_pool=parse_pool)
            await state.batches.start()
            stack.push_async_callback(state.batches.shutdown)
            app.state.ttc = state
            if tune_gc:
                gc.collect()
                gc.freeze()
                gc.set_threshold(20_000, 50, 100)
            log.info("ttc service ready (policies: %s; default: %s; auth %s)",
                     ", ".join(await state.policies.names()), await state.policies.default_name(),
                     "on" if settings.auth.enabled else "off")
            yield

    app = FastAPI(
        title="ttc: test-time compute allocation service",
        version="0.1.0",
        lifespan=lifespan,
        description="OpenAI-compatible gateway that decides how many samples each query gets. With auth on, "
                    "send `Authorization: Bearer <key>` (or `x-api-key: <key>`).",
        docs_url=None, redoc_url=None, openapi_url=None,
    )
    install_error_handlers(app)
    app.add_middleware(EdgeMiddleware, max_bytes=settings.limits.max_body_bytes,
                       allowed_hosts=[*settings.server.allowed_hosts, settings.host],
                       allowed_origins=settings.server.allowed_origins)
    for router in (inference.router, system.router, batches.router, policies.router, keys.router, stats.router,
                   ui.router):  # hot first
        app.include_router(router)
    install_docs(app, settings.limits)
    return app


def _swagger_ui_assets() -> str:
    """The folder of Swagger UI 5 (it reads OpenAPI 3.1, which FastAPI writes) in the swagger-ui-py
    package, found without importing the package (its import loads web-framework adapters)."""
    spec = importlib.util.find_spec("swagger_ui")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("swagger-ui-py is not installed (pip install -e .)")
    return str(Path(next(iter(spec.submodule_search_locations))) / "static")


def install_docs(app: FastAPI, limits: LimitsConfig | None = None) -> None:
    """``/docs`` with Swagger UI served by the service itself (no CDN: it works offline), and an
    OpenAPI document that lists the error envelope instead of FastAPI's unused 422 and says the
    configured ``limits`` (the most messages, samples, tokens, prompt characters, batch prompts) on the
    request fields they bound."""
    app.mount("/docs/assets", StaticFiles(directory=_swagger_ui_assets()), name="docs-assets")

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi_json(_who: ReaderDep) -> JSONBytes:
        return JSONBytes(app.openapi())

    @app.get("/docs", include_in_schema=False)
    async def docs(_who: ReaderDep) -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} - docs",
                                   swagger_js_url="/docs/assets/swagger-ui-bundle.js",
                                   swagger_css_url="/docs/assets/swagger-ui.css",
                                   swagger_favicon_url="/docs/assets/favicon-32x32.png")

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description,
                                 routes=app.routes)
            envelope = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorEnvelope"}}}}
            for path in schema.get("paths", {}).values():
                for op in path.values():
                    responses = op.setdefault("responses", {})
                    responses.pop("422", None)
                    for status, text in COMMON_ERRORS.items():  # what any route may answer
                        responses.setdefault(str(status), {"description": text, **envelope})
            schemas = schema.setdefault("components", {}).setdefault("schemas", {})
            for name in ("HTTPValidationError", "ValidationError"):
                schemas.pop(name, None)
            for name, body in request_schemas().items():
                schemas.setdefault(name, body)
            if limits is not None:
                document_limits(schemas, limits)
            document_parts(schemas, allocators=available_allocators(), aggregators=builtin_aggregators(),
                           verifiers=builtin_verifiers())
            for model in (ErrorEnvelope,):  # every route may answer with it
                extra = model.model_json_schema(ref_template="#/components/schemas/{model}")
                for name, body in extra.pop("$defs", {}).items():
                    schemas.setdefault(name, body)
                schemas.setdefault(model.__name__, extra)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
