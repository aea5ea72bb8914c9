"""The embedded default: a local vLLM CPU engine run as a child process on loopback.

Started when no backend URL is configured. The engine lives in its own venv (``make vllm-venv``);
it is started from an empty temporary folder (vLLM must not see files named like stdlib modules),
with the offline environment vLLM needs here, and stopped with SIGTERM to its process group (SIGKILL
after a grace period) on shutdown; if the service itself dies, the kernel sends the engine SIGTERM.
Once it answers, its engine core shares its model worker's cores (:func:`pin_engine_core`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from app.config import EngineConfig
from app.procs import children, move_to_cpus

log = logging.getLogger("ttc.engine")

OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


class EngineStartError(RuntimeError):
    pass


def _die_with_parent() -> None:
    """In the child: ask Linux to SIGTERM us if the service dies (even by SIGKILL)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def engine_command(cfg: EngineConfig, port: int) -> list[str]:
    return [
        str(cfg.python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(cfg.model_dir), "--served-model-name", cfg.served_model_name,
        "--host", cfg.host, "--port", str(port), "--dtype", cfg.dtype,
        # on by default in vLLM's V1 engine; said explicitly: the stream schedule's calls share prompts
        "--enable-prefix-caching",
        *(["--max-model-len", str(cfg.max_model_len)] if cfg.max_model_len else []),
        *cfg.extra_args,
    ]


def pin_engine_core(api_server: int) -> set[int] | None:
    """Move the processes vLLM's API server (pid ``api_server``) started, its engine core among them,
    onto the cores its model worker (their child) is bound to; returns those cores, or ``None`` when
    there is no worker or it is not bound to fewer cores than the API server may use.

    Why: vLLM's CPU platform binds the worker's OpenMP threads to some cores and leaves the rest
    (one on a 2-core machine) to "other processes"; the engine core is not bound, and between two
    steps it busy-waits (``sched_yield``) on the shared-memory queue for the worker's result, so it
    takes most of a free core, the one where the API server turns tokens into server-sent events and
    this service runs. The engine core and the worker take turns (one schedules while the other
    waits), so on the worker's cores the engine core costs the model little. Measured on this 2-core
    machine with ``ttc bench latency`` (README, "Trace monitors inside the engine")."""
    engine_procs = children(api_server)
    workers = [w for p in engine_procs for w in children(p)]
    try:
        bound = set().union(*(os.sched_getaffinity(w) for w in workers)) if workers else set()
        free = os.sched_getaffinity(api_server)
    except OSError:
        return None
    if not bound or not bound < free:
        return None
    for pid in engine_procs:
        move_to_cpus(pid, bound)
    return bound


class EmbeddedEngine:
    """Start, wait for and stop one vLLM CPU server. ``url`` is set once started; ``env`` is added to
    the engine's environment (e.g. a cache folder of its own, see the integration tests)."""

    def __init__(self, cfg: EngineConfig, log_path: Path | None = None, env: dict[str, str] | None = None) -> None:
        self.cfg = cfg
        self.log_path = log_path
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.pinned: set[int] | None = None
        self._workdir: tempfile.TemporaryDirectory[str] | None = None

    def check(self) -> None:
        if not Path(self.cfg.python).exists():
            raise EngineStartError(
                f"The vLLM CPU engine's Python ({self.cfg.python}) does not exist. Run `make vllm-venv` "
                "(or configure a backend URL with TTC_BACKENDS='[{\"url\": \"http://host:port\"}]')."
            )
        if not (Path(self.cfg.model_dir) / "config.json").exists():
            raise EngineStartError(f"No model at {self.cfg.model_dir} (config.json missing).")

    def start(self) -> None:
        self.check()
        port = self.cfg.port or free_port(self.cfg.host)
        self.url = f"http://{self.cfg.host}:{port}"
        env = {**os.environ, **OFFLINE_ENV, "VLLM_CPU_KVCACHE_SPACE": str(self.cfg.kvcache_space_gb), **self.env}
        self._workdir = tempfile.TemporaryDirectory(prefix="ttc-vllm-")
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        cmd = engine_command(self.cfg, port)
        log.info("starting embedded vLLM engine: %s", " ".join(cmd))
        self.proc = subprocess.Popen(
            cmd, cwd=self._workdir.name, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=_die_with_parent,
        )

    async def wait_ready(self) -> None:
        """Poll ``/health`` until 200; fail fast if the process dies; give up after the timeout."""
        assert self.proc is not None
        deadline = time.monotonic() + self.cfg.startup_timeout_s
        async with httpx.AsyncClient(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise EngineStartError(
                        f"vLLM engine exited with code {self.proc.returncode} during start-up"
                        + (f"; the end of {self.log_path}:\n{self.log_tail()}" if self.log_path else "")
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(self.url + "/health")).status_code == 200:
                        log.info("embedded vLLM engine ready at %s", self.url)
                        self.pin()
                        return
                await asyncio.sleep(0.5)
        self.stop()
        raise EngineStartError(f"vLLM engine not healthy after {self.cfg.startup_timeout_s:.0f}s")

    def pin(self) -> None:
        """:func:`pin_engine_core` when the config asks for it; ``pinned``: the cores, else ``None``."""
        if self.cfg.pin_engine_core and self.proc is not None:
            self.pinned = pin_engine_core(self.proc.pid)
            log.info("engine %s: engine core %s", self.cfg.served_model_name,
                     f"moved to cores {sorted(self.pinned)}" if self.pinned else "left where it is (worker not bound)")

    def log_tail(self, lines: int = 25) -> str:
        """The last lines of the engine's log (what a failed start-up said)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 16384))
            return "\n".join(f.read().decode("utf-8", "replace").splitlines()[-lines:])

    def stop(self, grace_s: float = 15.0) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
            log.info("embedded vLLM engine stopped")
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None


class EngineSet:
    """Several embedded engines started together (their compile warm-ups overlap) and stopped together:
    the generators become backends, the pooling models named endpoints. An engine whose model folder
    is missing is skipped with a warning (a model not trained yet); the first engine must exist.
    ``log_dir``: each engine's log, ``vllm-<served name>.log`` (the first one's at ``first_log``)."""

    def __init__(self, configs: list[EngineConfig], log_dir: Path | None, first_log: Path | None = None) -> None:
        self.engines: list[EmbeddedEngine] = []
        for i, cfg in enumerate(configs):
            if i and not (Path(cfg.model_dir) / "config.json").exists():
                log.warning("embedded engine %s skipped: no model at %s", cfg.served_model_name, cfg.model_dir)
                continue
            path = first_log if i == 0 and first_log else (
                log_dir / f"vllm-{cfg.served_model_name}.log" if log_dir else None)
            self.engines.append(EmbeddedEngine(cfg, log_path=path, env=_own_caches(log_dir, cfg) if i else None))

    def start(self) -> None:
        for engine in self.engines:
            engine.start()

    async def wait_ready(self) -> None:
        try:
            await asyncio.gather(*(e.wait_ready() for e in self.engines))
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for engine in self.engines:
            engine.stop()

    def generators(self) -> list[EmbeddedEngine]:
        return [e for e in self.engines if e.cfg.role == "generate"]

    def endpoints(self) -> dict[str, str]:
        return {e.cfg.served_model_name: e.url for e in self.engines if e.cfg.role == "pooling"}


def _own_caches(log_dir: Path | None, cfg: EngineConfig) -> dict[str, str]:
    """Engines that start at once must not share one torch.compile cache (they race on it)."""
    if log_dir is None:
        return {}
    cache = log_dir / f"cache-{cfg.served_model_name}"
    return {"VLLM_CACHE_ROOT": str(cache / "vllm"), "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor")}
