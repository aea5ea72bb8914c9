"""The application factory. Nothing is built at import time: ``create_app(settings)`` does it all,
and the lifespan owns every resource (HTTP client, backend pool, embedded engine, health checks)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
from fastapi import FastAPI

from app.backends.base import SampleSource
from app.backends.launcher import EmbeddedEngine
from app.backends.openai import OpenAIBackend
from app.backends.pool import BackendPool
from app.batches import BatchManager
from app.config import Settings
from app.engine import Engine
from app.errors import install_error_handlers
from app.metrics import Metrics
from app.policy import StaticPolicies
from app.routes import batches, inference, system
from app.state import AppState

log = logging.getLogger("ttc")


def create_app(
    settings: Settings,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    source: SampleSource | None = None,
    engine_log: Path | None = None,
) -> FastAPI:
    """Build the service. ``transport`` replaces the network for backend calls (tests);
    ``source`` replaces the backend pool altogether (replay, tests)."""
    policies = StaticPolicies(settings.policies, settings.default_policy)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        metrics = Metrics()
        limits = httpx.Limits(max_connections=settings.pool.max_connections,
                              max_keepalive_connections=settings.pool.max_connections)
        timeout = httpx.Timeout(settings.pool.request_timeout_s, connect=settings.pool.connect_timeout_s)
        embedded: EmbeddedEngine | None = None
        async with httpx.AsyncClient(transport=transport, limits=limits, timeout=timeout) as http:
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
                    backends = [OpenAIBackend(embedded.url, http, name="embedded",
                                              default_max_tokens=settings.limits.default_max_tokens)]
                else:
                    backends = [
                        OpenAIBackend(b.url, http, name=b.name or b.url, api_key=b.api_key,
                                      default_max_tokens=settings.limits.default_max_tokens)
                        for b in backend_cfgs
                    ]
                pool = BackendPool(backends, settings.pool, metrics)
                await pool.check_all()
                pool.start_health_checks()
                sample_source = pool
            app.state.ttc = AppState(
                settings=settings, http=http, source=sample_source,
                engine=Engine(sample_source, http, settings.limits.default_max_tokens),
                metrics=metrics, policies=policies, models=models, embedded=embedded,
            )
            app.state.ttc.extras["batches"] = BatchManager()
            log.info("ttc service ready (policies: %s; default: %s)", ", ".join(policies.names()),
                     settings.default_policy)
            try:
                yield
            finally:
                await app.state.ttc.extras["batches"].shutdown()
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
    return app
