"""The application factory. Nothing is built at import time: ``create_app(settings)`` does it all,
and the lifespan owns every resource (HTTP client, backend pool, embedded engine, health checks)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI

from app.answers import AnswerRuntime, ParsePool
from app.auth import Authenticator
from app.backends.base import SampleSource
from app.backends.http import open_shards
from app.backends.launcher import EmbeddedEngine
from app.backends.openai import OpenAIBackend
from app.backends.pool import BackendPool
from app.batches import BatchManager
from app.config import Settings
from app.engine import Engine
from app.errors import install_error_handlers
from app.metrics import Metrics
from app.ratelimit import MemoryBuckets, RateLimiter, RedisBuckets
from app.recording import Recorder
from app.routes import batches, inference, keys, policies, system
from app.shared_stats import SharedLearning
from app.state import AppState
from app.store import open_store
from app.store.policies import StorePolicies, spec_json, sync_declared

log = logging.getLogger("ttc")


def create_app(
    settings: Settings,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    source: SampleSource | None = None,
    engine_log: Path | None = None,
) -> FastAPI:
    """Build the service. ``transport`` replaces the network for backend calls (tests);
    ``source`` replaces the backend pool altogether (replay, tests).

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
            services = {
                "store": store, "recorder": recorder, "redis": redis,
                "auth": Authenticator(settings.auth, store, ttl_s=settings.store.cache_ttl_s),
                "limiter": RateLimiter(RedisBuckets(redis, settings.redis.prefix) if redis else MemoryBuckets()),
                "shared_stats": SharedLearning(redis, settings.redis.prefix) if redis else None,
            }
            resolver = StorePolicies(store, ttl_s=settings.store.cache_ttl_s)
            async with serve(app, resolver, services):
                yield

    @contextlib.asynccontextmanager
    async def serve(app: FastAPI, resolver: StorePolicies, services: dict[str, Any]) -> AsyncIterator[None]:
        metrics = Metrics()
        timeout = httpx.Timeout(settings.pool.request_timeout_s, connect=settings.pool.connect_timeout_s)
        embedded: EmbeddedEngine | None = None
        async with open_shards(settings.pool.max_connections, timeout, transport=transport) as shards:
            http = shards.primary
            pool: BackendPool | None = None
            sample_source = source
            models: list[str] = []
            if sample_source is None:
                backend_cfgs = list(settings.backends)
                if not backend_cfgs:
                    embedded = EmbeddedEngine(settings.engine, log_path=engine_log)
                    embedded.start()
                    try:
                        await embedded.wait_ready()
                    except BaseException:
                        embedded.stop()
                        raise
                    models = [settings.engine.served_model_name]
                    backends = [OpenAIBackend(embedded.url, shards, name="embedded",
                                              default_max_tokens=settings.limits.default_max_tokens)]
                else:
                    backends = [
                        OpenAIBackend(b.url, shards, name=b.name or b.url, api_key=b.api_key,
                                      serialize_seeded=b.serialize_seeded,
                                      default_max_tokens=settings.limits.default_max_tokens)
                        for b in backend_cfgs
                    ]
                pool = BackendPool(backends, settings.pool, metrics)
                await pool.check_all()
                pool.start_health_checks()
                sample_source = pool
            answers = settings.answers
            parse_pool = ParsePool(answers.workers, answers.timeout_s, answers.max_pending,
                                   on_fallback=lambda reason: metrics.answer_fallbacks.labels(reason).inc())
            if answers.prestart:
                parse_pool.start()
            runtime = AnswerRuntime(parse_pool, max_compare=answers.max_compare)
            app.state.ttc = AppState(
                settings=settings, http=http, source=sample_source,
                engine=Engine(sample_source, http, settings.limits.default_max_tokens, runtime),
                metrics=metrics, policies=resolver, models=models, embedded=embedded, **services,
            )
            app.state.ttc.extras["batches"] = BatchManager()
            log.info("ttc service ready (policies: %s; default: %s; auth %s)", ", ".join(await resolver.names()),
                     await resolver.default_name(), "on" if settings.auth.enabled else "off")
            try:
                yield
            finally:
                await app.state.ttc.extras["batches"].shutdown()
                parse_pool.close()
                if pool is not None:
                    await pool.stop()
                if embedded is not None:
                    embedded.stop()

    app = FastAPI(
        title="ttc: test-time compute allocation service",
        version="0.1.0",
        lifespan=lifespan,
        description="OpenAI-compatible gateway that decides how many samples each query gets.",
    )
    install_error_handlers(app)
    app.include_router(system.router)
    app.include_router(inference.router)
    app.include_router(batches.router)
    app.include_router(policies.router)
    app.include_router(keys.router)
    return app
