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

What it says (plain lines on stderr, whatever ``--log-level`` says; with ``--log-format json``, JSON log
records of logger ``ttc.serve`` instead, so that stderr stays one object per line): what it starts
(the embedded engine with its model and log file, or the backends), then, once the application is
ready, ``ttc serving on http://HOST:PORT (console: .../ui, docs: .../docs)``.

Connections (``server`` settings, :class:`app.config.ServerConfig`), enforced by
:class:`GuardedHttpToolsProtocol`, uvicorn's httptools protocol with two additions:

* a request head (request line and headers) must be complete within ``header_timeout_s`` of the
  connection opening, or of the head's first byte on a kept-alive connection; otherwise the
  connection is closed (uvicorn itself waits for ever: slowloris);
* at most ``max_connections`` connections are kept: a new connection beyond it closes the one that
  has been idle longest (no request in progress: waiting for its first request, or kept alive
  between requests), so idle sockets cannot crowd out new clients; only when every connection has a
  request in progress is the newcomer refused (closed at once). The open-file limit is raised to its
  hard limit at start-up and the cap lowered to fit under it, keeping room for what the service
  opens itself (backend connections, the store, worker pipes), so that ``accept`` never fails for
  want of descriptors (which is what failed ``/health`` under 21,000 idle connections).

Idle kept-alive connections are closed after ``keep_alive_timeout_s`` (uvicorn's own timer). Every
limit is per process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import socket
import sys
import tempfile
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.config import BackendConfig, ServerConfig, Settings
from app.logs import LogFormat, setup_logging

SETTINGS_ENV = "TTC_SERVE_SETTINGS"
LOG_ENV = "TTC_SERVE_LOG"
log = logging.getLogger("ttc")
say_log = logging.getLogger("ttc.serve")


def run(settings: Settings, *, log_level: str, log_format: LogFormat, engine_log: Path) -> None:
    """Serve until interrupted (see the module doc)."""
    quiet_libraries(log_level)  # before app.main imports alembic, which logs as it loads
    from app.main import create_app

    sock = bind(settings.host, settings.port)
    port = sock.getsockname()[1]  # the port asked for, or the one the system chose for 0
    guard = install_guard(settings)
    common: dict[str, Any] = {
        "host": settings.host, "port": port, "log_level": log_level, "access_log": False,
        "timeout_graceful_shutdown": 10, "log_config": None, "http": GuardedHttpToolsProtocol,
        "timeout_keep_alive": settings.server.keep_alive_timeout_s, "backlog": settings.server.backlog}
    json_logs = log_format == "json"
    say_starting(settings, engine_log, json_logs=json_logs)
    log.info("connections%s: at most %d, request heads within %gs, idle keep-alive %gs",
             " per worker" if settings.workers > 1 else "", guard.max_connections,
             settings.server.header_timeout_s, settings.server.keep_alive_timeout_s)
    if settings.workers <= 1:  # uvicorn serves on the socket bound here, after the app's start-up
        app = create_app(settings, engine_log=engine_log, tune_gc=True)
        server = AnnouncingServer(uvicorn.Config(app, **common))
        server.ready_message = (ready_line(settings, port), json_logs, base_url(settings.host, port))
        server.run(sockets=[sock])
        return
    engines = None
    try:
        with sock:  # held while the engines start; uvicorn binds the port again for its workers
            if not settings.backends:
                from app.backends.launcher import EngineSet

                engines = EngineSet([settings.engine, *settings.extra_engines],
                                    engine_log.parent if engine_log else None, engine_log)
                engines.start()
                asyncio.run(engines.wait_ready())
                settings = settings.model_copy(update={
                    "backends": [BackendConfig(url=e.url, name=e.cfg.served_model_name) for e in engines.generators()],
                    "endpoints": {**settings.endpoints, **engines.endpoints()}})
        if settings.redis.url is None:
            log.warning("%d workers without redis.url: rate limits and learned statistics are per worker",
                        settings.workers)
        with tempfile.TemporaryDirectory(prefix="ttc-metrics-") as metrics_dir:
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
            os.environ[SETTINGS_ENV] = settings.model_copy(update={"port": port}).model_dump_json()
            os.environ[LOG_ENV] = f"{log_level}:{log_format}"
            uvicorn.run("app.serve:worker_app", factory=True, workers=settings.workers, **common)
    finally:
        if engines is not None:
            engines.stop()


def quiet_libraries(log_level: str) -> None:
    """Alembic announces each of its plugins and its context at INFO on every start: only at debug."""
    if log_level.lower() != "debug":
        logging.getLogger("alembic").setLevel(logging.WARNING)


def say(message: str, *, json_logs: bool, **fields: Any) -> None:
    """A line the operator must see whatever ``--log-level`` says: plain on stderr with text logs, one
    JSON log record (logger ``ttc.serve``, the ``fields`` at its top level) with JSON logs."""
    if not json_logs:
        print(message, file=sys.stderr, flush=True)
        return
    record = say_log.makeRecord(say_log.name, logging.INFO, __file__, 0, message, (), None,
                                extra={"ttc": {"event": "serve", **fields}})
    for handler in logging.getLogger().handlers:
        handler.handle(record)


def base_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def say_starting(settings: Settings, engine_log: Path, *, json_logs: bool) -> None:
    """What is about to start (and, for the embedded engine, where its log goes)."""
    if settings.backends:
        urls = ", ".join(b.url for b in settings.backends)
        say(f"ttc: starting, backends: {urls} ...", json_logs=json_logs, backends=[b.url for b in settings.backends])
        return
    cfg = settings.engine
    others = [e for e in settings.extra_engines if (e.model_dir / "config.json").exists()]
    more = "".join(f", {e.served_model_name} ({'pooling' if e.role == 'pooling' else 'generation'}, log: "
                   f"{(engine_log.parent / f'vllm-{e.served_model_name}.log').resolve()})" for e in others)
    say(f"ttc: starting the embedded vLLM engines: {cfg.served_model_name} (from {cfg.model_dir}, log: "
        f"{engine_log.resolve()}){more}; their first start takes a minute or two ...", json_logs=json_logs,
        model=cfg.served_model_name, model_dir=str(cfg.model_dir), engine_log=str(engine_log.resolve()),
        engines=[e.served_model_name for e in others])


def ready_line(settings: Settings, port: int) -> str:
    url = base_url(settings.host, port)
    console = f"console: {url}/ui, " if settings.ui.enabled else ""
    workers = f"; worker pid {os.getpid()} of {settings.workers}" if settings.workers > 1 else ""
    return f"ttc serving on {url} ({console}docs: {url}/docs{workers})"


class AnnouncingServer(uvicorn.Server):
    """A uvicorn server that says :func:`ready_line` once it listens (after the app's start-up)."""

    ready_message: tuple[str, bool, str] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.ready_message is not None:
            message, json_logs, url = self.ready_message
            say(message, json_logs=json_logs, url=url)


def announce_when_ready(app: FastAPI, settings: Settings, port: int, *, json_logs: bool) -> None:
    """Say :func:`ready_line` once the app's start-up (the lifespan: store, backends or the embedded
    engine) is done (a worker of several: the port is already listening, in the parent)."""
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(instance: Any) -> AsyncIterator[Any]:
        async with inner(instance) as state:
            say(ready_line(settings, port), json_logs=json_logs, url=base_url(settings.host, port))
            yield state

    app.router.lifespan_context = lifespan


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
    quiet_libraries(level)
    settings = Settings.model_validate_json(os.environ[SETTINGS_ENV])
    install_guard(settings)
    app = create_app(settings, tune_gc=True)
    announce_when_ready(app, settings, settings.port, json_logs=fmt == "json")
    return app


class ConnectionGuard:
    """The connections of one server process: how many are open, and which have no request in
    progress, oldest idle first (the ones a newcomer beyond ``max_connections`` closes)."""

    def __init__(self, cfg: ServerConfig, max_connections: int | None = None) -> None:
        self.header_timeout_s = cfg.header_timeout_s
        self.max_connections = max_connections or cfg.max_connections
        self.open = 0
        self.idle: OrderedDict[GuardedHttpToolsProtocol, None] = OrderedDict()
        self.evicted = self.refused = self.timed_out = 0
        self._warned_at = float("-inf")

    def opened(self, conn: GuardedHttpToolsProtocol) -> bool:
        """Count a new connection (idle until its first head completes); ``False`` when it was refused."""
        self.open += 1
        conn.counted = True
        self.idle[conn] = None
        if self.open <= self.max_connections:
            return True
        victim = next((c for c in self.idle if c is not conn), None)
        if victim is None:  # every other connection has a request in progress
            self.refused += 1
            self._warn("refused a new connection")
            self.drop(conn)
            return False
        self.evicted += 1
        self._warn("closed the connection idle longest")
        self.drop(victim)
        return True

    def drop(self, conn: GuardedHttpToolsProtocol) -> None:
        """Stop counting ``conn`` and close it (its ``connection_lost`` comes later)."""
        self.forget(conn)
        conn.transport.close()

    def forget(self, conn: GuardedHttpToolsProtocol) -> None:
        if conn.counted:
            conn.counted = False
            self.open -= 1
        self.idle.pop(conn, None)

    def busy(self, conn: GuardedHttpToolsProtocol) -> None:
        self.idle.pop(conn, None)

    def rested(self, conn: GuardedHttpToolsProtocol) -> None:
        if conn.counted:
            self.idle[conn] = None
            self.idle.move_to_end(conn)

    def _warn(self, what: str) -> None:
        now = time.monotonic()
        if now - self._warned_at >= 10:  # at most one line per 10 s under a flood
            self._warned_at = now
            log.warning("%d connections open (server.max_connections): %s (so far: %d closed idle, %d refused)",
                        self.max_connections, what, self.evicted, self.refused)


_guard: ConnectionGuard | None = None


def current_guard() -> ConnectionGuard:
    global _guard
    if _guard is None:
        _guard = ConnectionGuard(ServerConfig())
    return _guard


def install_guard(settings: Settings) -> ConnectionGuard:
    """This process's :class:`ConnectionGuard`, its cap fitted under the open-file limit (raised to
    the hard limit when the cap needs more); see the module doc."""
    global _guard
    cfg = settings.server
    reserve = settings.pool.max_connections + 256  # backend connections, the store, pipes, logs
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = cfg.max_connections + reserve
    if soft != resource.RLIM_INFINITY and soft < want:
        target = want if hard == resource.RLIM_INFINITY else min(hard, want)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    cap = cfg.max_connections
    if soft != resource.RLIM_INFINITY and soft < want:
        cap = max(16, min(cfg.max_connections, max(soft - reserve, soft // 2)))
        log.warning("open-file limit %d (hard %s): server.max_connections lowered from %d to %d", soft,
                    "unlimited" if hard == resource.RLIM_INFINITY else hard, cfg.max_connections, cap)
    _guard = ConnectionGuard(cfg, cap)
    return _guard


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a request-head timeout and the connection cap of
    :class:`ConnectionGuard` (module doc). It hooks the parser's callbacks: a head starts at
    ``on_message_begin`` and is complete at ``on_headers_complete``; a connection is idle when its
    last request's response is complete."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.guard = current_guard()
        self.counted = False
        self.head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.guard.opened(self):
            self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        self.guard.forget(self)
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self.head_timer is None:
            self._arm_head_timer()

    def on_headers_complete(self) -> None:
        self._disarm_head_timer()
        self.guard.busy(self)
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self._idle():
            self.guard.rested(self)

    def handle_websocket_upgrade(self) -> None:
        """The connection passes to a WebSocket protocol (whose end this one never sees): stop counting it."""
        self._disarm_head_timer()
        self.guard.forget(self)
        super().handle_websocket_upgrade()

    def _idle(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm_head_timer(self) -> None:
        self.head_timer = self.loop.call_later(self.guard.header_timeout_s, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _head_timed_out(self) -> None:
        self.head_timer = None
        if self.transport.is_closing():
            return
        if not self._idle():  # a request is being served: a pipelined head behind it is judged after it
            self._arm_head_timer()
            return
        self.guard.timed_out += 1
        log.debug("closed a connection from %s: no complete request head within %gs", self.client,
                  self.guard.header_timeout_s)
        self.transport.close()
