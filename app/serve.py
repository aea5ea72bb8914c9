"""``ttc serve``: the service in one process, or in ``workers`` uvicorn worker processes sharing the
port (each a whole service: its own event loop, backend connections and answer workers).

With ``workers > 1`` the settings reach the workers as JSON in ``TTC_SERVE_SETTINGS`` (each worker
builds its app with :func:`worker_app`); an embedded vLLM engine, when no backend is configured, is
started once here and given to every worker as their backend; Prometheus metrics are aggregated over
the workers (``PROMETHEUS_MULTIPROC_DIR``, a temporary folder). What the workers do not share: rate
limits (per worker, unless ``redis.url`` is set), learned statistics (likewise) and background
batches (refused: a poll could reach another worker; synchronous batches work).
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from pathlib import Path

from fastapi import FastAPI

from app.config import BackendConfig, Settings
from app.logs import LogFormat, setup_logging

SETTINGS_ENV = "TTC_SERVE_SETTINGS"
LOG_ENV = "TTC_SERVE_LOG"
log = logging.getLogger("ttc")


def run(settings: Settings, *, log_level: str, log_format: LogFormat, engine_log: Path) -> None:
    """Serve until interrupted (see the module doc)."""
    import uvicorn

    from app.main import create_app

    common = {"host": settings.host, "port": settings.port, "log_level": log_level, "access_log": False,
              "timeout_graceful_shutdown": 10, "log_config": None}
    if settings.workers <= 1:
        uvicorn.run(create_app(settings, engine_log=engine_log, tune_gc=True), **common)  # type: ignore[arg-type]
        return
    engine = None
    if not settings.backends:
        from app.backends.launcher import EmbeddedEngine

        engine = EmbeddedEngine(settings.engine, log_path=engine_log)
        engine.start()
        asyncio.run(engine.wait_ready())
        settings = settings.model_copy(update={"backends": [BackendConfig(url=engine.url, name="embedded")]})
    if settings.redis.url is None:
        log.warning("%d workers without redis.url: rate limits and learned statistics are per worker",
                    settings.workers)
    try:
        with tempfile.TemporaryDirectory(prefix="ttc-metrics-") as metrics_dir:
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
            os.environ[SETTINGS_ENV] = settings.model_dump_json()
            os.environ[LOG_ENV] = f"{log_level}:{log_format}"
            uvicorn.run("app.serve:worker_app", factory=True, workers=settings.workers, **common)  # type: ignore[arg-type]
    finally:
        if engine is not None:
            engine.stop()


def worker_app() -> FastAPI:
    """The app of one worker process, from the settings the parent put in the environment."""
    from app.main import create_app

    level, _, fmt = os.environ.get(LOG_ENV, "info:text").partition(":")
    setup_logging(level, "json" if fmt == "json" else "text")
    settings = Settings.model_validate_json(os.environ[SETTINGS_ENV])
    return create_app(settings, tune_gc=True)
