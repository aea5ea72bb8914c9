"""The scale-out topology as processes on one machine, for tests and demos.

``Topology(replicas=N, backends=M)`` starts, on loopback with free ports and all in one temporary
folder (configs, data, logs):

* a private PostgreSQL cluster (``initdb`` + ``pg_ctl``, trust auth; as root it runs as the
  ``postgres`` system user via ``runuser``) holding one database, ``ttc``, that every replica shares;
* a private ``redis-server`` (no persistence), shared by every replica under one key prefix;
* M backends: ``ttc fake-backend`` processes (the default), or vLLM CPU servers started by the
  embedded-engine launcher (:class:`app.backends.launcher.EmbeddedEngine`, needs ``make vllm-venv``);
* N ``ttc serve`` replicas, each with a YAML config naming that store, that Redis and every backend
  (their ``TTC_*`` environment is dropped: the YAML is the whole config);
* HAProxy in front of the replicas: round-robin, an HTTP health check of every replica's ``/health``,
  a request whose replica refused the connection or closed it without answering is retried on another
  one, responses (server-sent events included) are passed through as they come. Its statistics page
  (``lb.stats_url``, CSV at ``;csv``) and Prometheus exporter (``/metrics`` there) are on a port of
  their own.

Everything is stopped on exit, also when start-up fails (then the end of every log is printed).
The binaries come from Debian (``scripts/test-services.sh`` installs them); a missing one raises
:class:`MissingBinary`, whose message says what to install.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import glob
import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import httpx
import yaml

from ttc_tools.bench import procs

__all__ = ["Backend", "LoadBalancer", "MissingBinary", "Postgres", "Service", "Topology", "haproxy_config",
           "haproxy_exe", "postgres_bindir", "postgres_cluster", "redis_exe", "redis_server"]

HINT = "run scripts/test-services.sh (apt-get install {})"


class MissingBinary(RuntimeError):
    """A server binary the topology needs is not installed (the message says which and how)."""


def postgres_bindir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found or not shutil.which("psql"):
        raise MissingBinary("PostgreSQL binaries missing: " + HINT.format("postgresql"))
    return Path(found[-1]).parent


def redis_exe() -> str:
    exe = shutil.which("redis-server")
    if exe is None:
        raise MissingBinary("redis-server missing: " + HINT.format("redis-server"))
    return exe


def haproxy_exe() -> str:
    exe = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin")  # sbin: off a user's PATH
    if exe is None:
        raise MissingBinary("haproxy missing: " + HINT.format("haproxy"))
    return exe


@contextlib.contextmanager
def _folder(root: Path | None, prefix: str) -> Iterator[Path]:
    """``root`` as given, or a new temporary folder removed afterwards."""
    if root is not None:
        root.mkdir(parents=True, exist_ok=True)
        yield root
        return
    made = Path(tempfile.mkdtemp(prefix=prefix))
    made.chmod(0o711)  # other users may pass (a cluster run as the postgres user, inside)
    try:
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)


@dataclass
class Postgres:
    """A running PostgreSQL server (user ``postgres``, trust auth)."""

    host: str
    port: int
    log: Path | None = None

    def url(self, db: str = "postgres") -> str:
        """The store URL of database ``db`` (SQLAlchemy + asyncpg)."""
        return f"postgresql+asyncpg://postgres@{self.host}:{self.port}/{db}"

    def create_db(self, name: str | None = None) -> str:
        """Create a database (a fresh random name by default); its store URL."""
        name = name or f"t_{uuid.uuid4().hex[:10]}"
        self.psql(f"CREATE DATABASE {name}")
        return self.url(name)

    def psql(self, sql: str) -> None:
        subprocess.run(["psql", "-h", self.host, "-p", str(self.port), "-U", "postgres", "-d", "postgres",
                        "-v", "ON_ERROR_STOP=1", "-qc", sql], check=True, capture_output=True)


@contextlib.contextmanager
def postgres_cluster(root: Path | None = None) -> Iterator[Postgres]:
    """A private cluster in the folder ``root`` (made if missing; default: a new temporary folder) on
    a free loopback port. As root, the folder is handed to the ``postgres`` user, who must be able to
    reach it."""
    bindir = postgres_bindir()
    with _folder(root, "ttc-pg-") as home:
        as_user: list[str] = []
        if os.geteuid() == 0:  # initdb refuses root: the cluster belongs to the postgres system user
            shutil.chown(home, "postgres")
            as_user = ["runuser", "-u", "postgres", "--"]
            if subprocess.run([*as_user, "test", "-w", str(home)], capture_output=True).returncode != 0:
                raise RuntimeError(f"the postgres user cannot write {home}: a folder on its way is closed to it")
        data, log = home / "data", home / "postgres.log"
        port = procs.free_port()
        subprocess.run([*as_user, str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
                        "-E", "UTF8", "--no-sync"], check=True, capture_output=True)
        opts = f"-p {port} -k {home} -c listen_addresses=127.0.0.1 -c max_connections=200"
        try:
            subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", opts,
                            "-w", "-t", "60", "start"], check=True, capture_output=True)
        except subprocess.CalledProcessError as exc:
            raise RuntimeError(f"PostgreSQL did not start:\n{procs.log_tail(log)}") from exc
        try:
            yield Postgres("127.0.0.1", port, log)
        finally:
            subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                           capture_output=True)


@contextlib.contextmanager
def redis_server(root: Path | None = None) -> Iterator[str]:
    """A private ``redis-server`` (no persistence) on a free loopback port; yields its URL."""
    exe = redis_exe()
    with _folder(root, "ttc-redis-") as base:
        port = procs.free_port()
        with open(base / "redis.log", "ab") as log:
            proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                     "--appendonly", "no", "--dir", str(base)], stdout=log, stderr=subprocess.STDOUT)
        try:
            procs.wait_port(port, 20, proc)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            procs.stop_process(proc)


class Service:
    """A ``ttc serve --config`` subprocess on a free loopback port; config and log in ``workdir``.

    Environment variables starting with one of ``drop_env`` are not passed on (the default: the
    store's, which the YAML names)."""

    def __init__(self, workdir: Path, config: Mapping[str, Any], env: Mapping[str, str] | None = None,
                 cwd: Path | None = None, drop_env: Sequence[str] = ("TTC_STORE__",)) -> None:
        self.port = procs.free_port()
        self.config_path = workdir / f"ttc-{self.port}.yaml"
        self.config_path.write_text(yaml.safe_dump({**config, "port": self.port}))
        self.log = workdir / f"ttc-{self.port}.log"
        self.cwd = cwd or workdir
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(tuple(drop_env))}
        self.env.update(env or {})
        self.proc: subprocess.Popen[Any] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def start(self) -> Service:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([procs.ttc_exe(), "serve", "--config", str(self.config_path),
                                          "--log-level", "warning"],
                                         cwd=self.cwd, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        return self

    def wait_ready(self, timeout: float = 90) -> None:
        """Until ``/health`` answers 200; the end of the log in the error if it exits or times out."""
        assert self.proc is not None, "not started"
        try:
            procs.wait_http(self.url + "/health", self.proc, timeout)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}:\n{procs.log_tail(self.log, 40)}") from None

    def kill(self) -> None:
        """SIGKILL (a crash), and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            procs.stop_process(self.proc)


@dataclass
class Backend:
    """One generation backend of the topology (``kind`` fake or vllm)."""

    url: str
    pid: int
    kind: str
    log: Path

    def kill(self) -> None:
        """SIGKILL it (a vLLM server with its engine processes: its whole process group)."""
        with contextlib.suppress(ProcessLookupError):
            if self.kind == "vllm":
                os.killpg(self.pid, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)


def haproxy_config(servers: Sequence[tuple[str, str, int]], port: int, stats_port: int,
                   check_interval_ms: int = 1000, host: str = "127.0.0.1", admin_socket: Path | None = None) -> str:
    """HAProxy config of the local topology: ``servers`` are ``(name, host, port)`` of the replicas;
    ``admin_socket``: a runtime API socket (``set server replicas/r2 state maint``)."""
    lines = [
        "global",
        *([f"    stats socket {admin_socket} mode 600 level admin"] if admin_socket else []),
        "    nbthread 1",  # loopback load on a small machine; the replicas need the cores
        "    maxconn 4096",
        "    log stdout format raw local0",
        "defaults",
        "    mode http",
        "    log global",
        "    option httplog",
        "    option dontlog-normal",  # only errors and retried/aborted requests are logged
        "    option http-no-delay",  # forward every piece of a streamed response at once
        "    timeout connect 2s",
        "    timeout client 10m",  # a request may draw many samples; streams stay open as long
        "    timeout server 10m",
        "    timeout http-request 30s",
        "    timeout http-keep-alive 30s",
        "    timeout queue 60s",
        "    timeout check 2s",
        "    retries 3",
        "    option redispatch 1",  # every retry goes to another replica
        "    retry-on conn-failure empty-response",  # refused, or closed before a byte of answer (a crash)
        "    option http-buffer-request",  # a request is retryable only once wholly received (≤ one buffer)
        "frontend ttc",
        f"    bind {host}:{port}",
        "    option forwardfor",
        "    default_backend replicas",
        "backend replicas",
        "    balance roundrobin",
        "    option httpchk",
        "    http-check send meth GET uri /health",
        "    http-check expect status 200",
        f"    default-server check inter {check_interval_ms} fastinter {max(check_interval_ms // 4, 100)} "
        "fall 2 rise 2 observe layer4 error-limit 2 on-error fastinter",
        *(f"    server {name} {h}:{p}" for name, h, p in servers),
        "frontend stats",
        f"    bind {host}:{stats_port}",
        "    http-request use-service prometheus-exporter if { path /metrics }",
        "    stats enable",
        "    stats uri /stats",
        "    stats refresh 5s",
        "",
    ]
    return "\n".join(lines)


class LoadBalancer:
    """HAProxy (``haproxy -db``) in front of ``servers``, config and log in ``workdir``."""

    def __init__(self, workdir: Path, servers: Sequence[tuple[str, str, int]], check_interval_ms: int = 1000) -> None:
        self.exe = haproxy_exe()
        self.port, self.stats_port = procs.free_port(), procs.free_port()
        self.names = [name for name, _, _ in servers]
        self.config_path = workdir / "haproxy.cfg"
        self.admin_socket = workdir / "haproxy.sock"
        self.config_path.write_text(haproxy_config(servers, self.port, self.stats_port, check_interval_ms,
                                                   admin_socket=self.admin_socket))
        self.log = workdir / "haproxy.log"
        self.proc: subprocess.Popen[Any] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def stats_url(self) -> str:
        return f"http://127.0.0.1:{self.stats_port}/stats"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.stats_port}/metrics"

    def start(self, timeout: float = 20) -> None:
        check = subprocess.run([self.exe, "-c", "-q", "-f", str(self.config_path)], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy rejects {self.config_path}:\n{check.stdout}{check.stderr}")
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([self.exe, "-db", "-f", str(self.config_path)], stdout=log,
                                         stderr=subprocess.STDOUT)
        procs.wait_http(self.stats_url, self.proc, timeout)

    def servers(self) -> dict[str, dict[str, str]]:
        """The statistics row of every replica (``status`` UP/DOWN, ``check_status``, ``scur`` sessions
        now, ``lbtot`` times chosen, ``wretr``/``wredis`` retries and redispatches, ...)."""
        text = httpx.get(self.stats_url + ";csv", timeout=5).text.lstrip("# ")
        return {row["svname"]: row for row in csv.DictReader(io.StringIO(text))
                if row["pxname"] == "replicas" and row["svname"] not in ("FRONTEND", "BACKEND")}

    def wait_status(self, status: str, names: Sequence[str] | None = None, timeout: float = 30) -> None:
        """Until every server of ``names`` (default: all) has ``status`` (``UP``: after a passed check)."""
        want = list(names or self.names)

        def reached() -> bool:
            rows = self.servers()
            return all(rows[n]["status"] == status and (status != "UP" or rows[n]["check_status"] == "L7OK")
                       for n in want)

        try:
            procs.wait_until(reached, timeout, proc=self.proc, what=f"haproxy servers {want} {status}")
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}; now: {({n: r['status'] for n, r in self.servers().items()})}") from None

    def command(self, line: str) -> str:
        """One command of HAProxy's runtime API; its answer."""
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(str(self.admin_socket))
            sock.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def set_state(self, name: str, state: Literal["ready", "drain", "maint"]) -> None:
        """Take a replica out of rotation (``maint``: no traffic, no checks) or back in (``ready``: in
        again once its health check passes)."""
        answer = self.command(f"set server replicas/{name} state {state}").strip()
        if answer:
            raise RuntimeError(f"haproxy: {answer}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            procs.stop_process(self.proc)


class Topology:
    """N ``ttc serve`` replicas behind HAProxy, sharing a PostgreSQL store and a Redis, in front of M
    backends, as processes on this machine (see the module docstring). A context manager::

        with Topology(replicas=2, backends=1) as topo:
            httpx.post(topo.url + "/v1/chat/completions", json=...)
            topo.replicas[0].kill()

    ``config`` is merged into every replica's YAML (section by section); ``latency_ms``,
    ``token_latency_ms`` and ``p_correct`` shape fake backends; with ``workdir`` everything lives in
    that (empty) folder, which is then kept, else in a new temporary folder, removed on exit."""

    def __init__(self, replicas: int = 2, backends: int = 1, backend: Literal["fake", "vllm"] = "fake", *,
                 latency_ms: float = 20.0, token_latency_ms: float = 0.0, p_correct: float | None = None,
                 config: Mapping[str, Any] | None = None, workdir: Path | None = None,
                 check_interval_ms: int = 1000, startup_timeout_s: float = 120.0) -> None:
        if replicas < 1 or backends < 1:
            raise ValueError("a topology needs at least one replica and one backend")
        if backend not in ("fake", "vllm"):
            raise ValueError(f"backend must be fake or vllm, not {backend!r}")
        self.n_replicas, self.n_backends, self.backend_kind = replicas, backends, backend
        self.latency_ms, self.token_latency_ms, self.p_correct = latency_ms, token_latency_ms, p_correct
        self.config = dict(config or {})
        self.workdir, self.check_interval_ms, self.startup_timeout_s = workdir, check_interval_ms, startup_timeout_s
        self.replicas: list[Service] = []
        self.backends: list[Backend] = []
        self.root: Path | None = None
        self._stack = contextlib.ExitStack()

    # -- life cycle

    def __enter__(self) -> Topology:
        try:
            self._start()
        except BaseException:
            tails = self.log_tails()
            self._stack.close()
            print(f"topology start-up failed; the end of its logs:\n{tails}", file=sys.stderr)
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stack.close()

    def _start(self) -> None:
        self.root = self._stack.enter_context(_folder(self.workdir, "ttc-scale-"))
        self.postgres = self._stack.enter_context(postgres_cluster(self.root / "postgres"))
        self.postgres_url = self.postgres.create_db("ttc")
        self.redis_url = self._stack.enter_context(redis_server(self.root / "redis"))
        self._start_backends()
        base: dict[str, Any] = {
            "host": "127.0.0.1",
            "backends": [{"url": b.url, "name": f"{b.kind}-{i}"} for i, b in enumerate(self.backends)],
            "default_model": self._model(),
            "store": {"url": self.postgres_url},
            "redis": {"url": self.redis_url, "prefix": "ttc"},
        }
        replica_config = {**base, **{k: {**base[k], **v} if isinstance(v, dict) and isinstance(base.get(k), dict)
                                     else v for k, v in self.config.items()}}
        replica_dir = self.root / "replicas"
        replica_dir.mkdir()
        for _ in range(self.n_replicas):
            svc = Service(replica_dir, replica_config, drop_env=("TTC_",))
            self._stack.callback(svc.stop)
            self.replicas.append(svc.start())
        for svc in self.replicas:  # started together, waited for one by one
            svc.wait_ready(self.startup_timeout_s)
        self.lb = LoadBalancer(self.root, [(f"r{i + 1}", "127.0.0.1", s.port) for i, s in enumerate(self.replicas)],
                               self.check_interval_ms)
        self._stack.callback(self.lb.stop)
        self.lb.start()
        self.lb.wait_status("UP")

    def _model(self) -> str:
        if self.backend_kind == "vllm":
            from app.config import EngineConfig

            return EngineConfig().served_model_name
        return "fake-model"

    def _start_backends(self) -> None:
        assert self.root is not None
        logs = [self.root / f"backend-{i}.log" for i in range(self.n_backends)]
        if self.backend_kind == "fake":
            for log in logs:
                url = self._stack.enter_context(procs.fake_backend(
                    self.latency_ms, token_latency_ms=self.token_latency_ms, p_correct=self.p_correct, log=log))
                self.backends.append(Backend(str(url), url.pid, "fake", log))
            return
        from app.backends.launcher import EmbeddedEngine
        from app.config import EngineConfig

        engines = [EmbeddedEngine(EngineConfig(), log_path=log) for log in logs]
        for engine in engines:  # all started, then waited for (they load in parallel)
            self._stack.callback(engine.stop)
            engine.start()
        for engine, log in zip(engines, logs, strict=True):
            asyncio.run(engine.wait_ready())
            assert engine.proc is not None
            self.backends.append(Backend(engine.url, engine.proc.pid, "vllm", log))

    # -- what a caller reads

    @property
    def url(self) -> str:
        """The load balancer: where clients go."""
        return self.lb.url

    def metrics_urls(self) -> list[str]:
        return [r.url + "/metrics" for r in self.replicas]

    def log_tails(self, lines: int = 15) -> str:
        """The end of every log of the topology (what a failed start said)."""
        root = self.root
        if root is None:
            return "(no logs: the topology's folder was not made)"
        return "\n".join(f"--- {p.relative_to(root)}\n{procs.log_tail(p, lines)}" for p in sorted(root.rglob("*.log")))

    def describe(self) -> str:
        """What runs where, one line each."""
        rows = [("load balancer", self.url), ("haproxy stats", self.lb.stats_url),
                ("haproxy metrics", self.lb.metrics_url)]
        for i, r in enumerate(self.replicas):
            rows += [(f"replica r{i + 1} (pid {r.pid})", r.url), (f"replica r{i + 1} metrics", r.url + "/metrics")]
        rows += [(f"backend {i} ({b.kind}, pid {b.pid})", b.url) for i, b in enumerate(self.backends)]
        rows += [("postgres (store)", self.postgres_url), ("redis", self.redis_url), ("folder", str(self.root))]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
