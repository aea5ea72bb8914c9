"""``ttc serve``: the service in one process, or in ``workers`` uvicorn worker processes sharing the
port (each a whole service: its own event loop, backend connections and answer workers).

With ``workers > 1`` the settings reach the workers as JSON in ``TTC_SERVE_SETTINGS`` (each worker
builds its app with :func:`worker_app`); an embedded vLLM engine, when no backend is configured, is
started once here and given to every worker as their backend; Prometheus metrics are aggregated over
the workers (``PROMETHEUS_MULTIPROC_DIR``, a temporary folder). What the workers do not share: rate
limits (per worker, unless ``redis.url`` is set) and learned statistics (likewise). Batches live in
the store, so with a store the workers share (the default SQLite file, or PostgreSQL) either worker
answers for any batch; an in-memory store refuses background batches.

The port is bound before anything slow starts (the embedded vLLM engine takes minutes): a port that
is taken fails at once, and no process started meanwhile (vLLM opens many ports of its own) can take
it from under the service.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
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
    sock = bind(settings.host, settings.port)
    if settings.workers <= 1:  # uvicorn serves on the socket bound here, after the app's start-up
        app = create_app(settings, engine_log=engine_log, tune_gc=True)
        uvicorn.Server(uvicorn.Config(app, **common)).run(sockets=[sock])  # type: ignore[arg-type]
        return
    engine = None
    try:
        with sock:  # held while the engine starts; uvicorn binds the port again for its workers
            if not settings.backends:
                from app.backends.launcher import EmbeddedEngine

                engine = EmbeddedEngine(settings.engine, log_path=engine_log)
                engine.start()
                asyncio.run(engine.wait_ready())
                settings = settings.model_copy(update={"backends": [BackendConfig(url=engine.url, name="embedded")]})
        if settings.redis.url is None:
            log.warning("%d workers without redis.url: rate limits and learned statistics are per worker",
                        settings.workers)
        with tempfile.TemporaryDirectory(prefix="ttc-metrics-") as metrics_dir:
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
            os.environ[SETTINGS_ENV] = settings.model_dump_json()
            os.environ[LOG_ENV] = f"{log_level}:{log_format}"
            uvicorn.run("app.serve:worker_app", factory=True, workers=settings.workers, **common)  # type: ignore[arg-type]
    finally:
        if engine is not None:
            engine.stop()


class PortTaken(RuntimeError):
    """The service's address cannot be bound (in use, or not an address of this machine)."""


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (``SO_REUSEADDR``, as uvicorn binds); :class:`PortTaken`
    when that fails."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise PortTaken(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    sock.set_inheritable(True)
    return sock


def worker_app() -> FastAPI:
    """The app of one worker process, from the settings the parent put in the environment."""
    from app.main import create_app

    level, _, fmt = os.environ.get(LOG_ENV, "info:text").partition(":")
    setup_logging(level, "json" if fmt == "json" else "text")
    settings = Settings.model_validate_json(os.environ[SETTINGS_ENV])
    return create_app(settings, tune_gc=True)
