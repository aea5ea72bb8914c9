"""Peer test-time-compute proxies, installed in their own venvs and started on loopback.

Each peer is configured for the same workload as this service's ``self-consistency-8`` policy:
draw 8 samples of one chat prompt from the shared backend and return the majority-voted answer.

its_hub 1.2.0 (``pip install 'its_hub[iaas]==1.2.0'`` into ``.venv-peer-its-hub``)
    Server: ``its-iaas --host 127.0.0.1 --port PORT --log-level WARNING`` (FastAPI + uvicorn).
    Configured once with ``POST /configure``::

        {"provider": "openai", "endpoint": "<backend>/v1", "api_key": "sk-local-dummy",
         "model": "<model>", "alg": "self-consistency", "budget": 8,
         "regex_patterns": ["The answer is\\s*\\$?(-?[0-9][0-9,./]*)"]}

    ``self-consistency`` is the only algorithm its IaaS server offers; the regex is its projection
    function (samples vote on the captured answer; its server refuses self-consistency without one).
    Each request also carries ``"budget": 8``. Its algorithm sends ``budget`` separate chat calls
    with one sample each (aiohttp), then votes.

optillm 0.4.0 (``pip install optillm==0.4.0 torch==2.13.0+cpu`` into ``.venv-peer-optillm``; see
:data:`TORCH_CPU` for why torch is pinned)
    Server: ``optillm --host 127.0.0.1 --port PORT --base-url <backend>/v1 --approach
    majority_voting --log warning`` with ``OPENAI_API_KEY=sk-local-dummy`` (Flask, threaded
    Werkzeug server). Its ``majority_voting`` plugin draws ``k`` samples in one call with ``n=k``
    and votes on the extracted, normalised final answer; each request carries ``"k": 8`` (8 is
    also its default). Its ``self_consistency`` approach is not used: it always draws 5 samples
    sequentially and clusters whole texts by string similarity, so it cannot be set to an 8-sample
    majority vote.

A peer that cannot be installed, started or configured is reported with the reason (the pip or
server log tail), never silently skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from app.backends.launcher import free_port
from ttc_tools.bench.procs import Endpoint, stop_process

DUMMY_KEY = "sk-local-dummy"
ANSWER_REGEX = r"The answer is\s*\$?(-?[0-9][0-9,./]*)"
SAMPLES = 8
#: optillm depends on torch; unpinned, pip takes the newest CUDA build from PyPI (~4 GB of nvidia-*
#: and triton wheels). The CPU build is not on PyPI: pip finds it where it is configured to (a local
#: wheel folder here, or PyTorch's CPU index given as TORCH_INDEX_URL).
TORCH_CPU = "torch==2.13.0+cpu"


class PeerError(RuntimeError):
    """A peer could not be installed, started or configured; the message says why."""


@dataclass(frozen=True)
class Peer:
    """How to install, start and address one peer (see the module docstring for each)."""

    name: str
    dist: str  # distribution name on PyPI
    version: str
    extras: str  # e.g. "[iaas]"
    venv: Path
    script: str
    health_path: str
    request_extra: dict[str, Any]
    argv: Callable[[int, str], list[str]]
    env: dict[str, str] = field(default_factory=dict)
    configure: Callable[[str, str, str], None] | None = None
    pins: tuple[str, ...] = ()  # installed alongside, e.g. torch's CPU build

    @property
    def requirement(self) -> str:
        return f"{self.dist}{self.extras}=={self.version}"

    def exe(self) -> Path:
        return self.venv / "bin" / self.script

    def description(self) -> str:
        argv = " ".join(self.argv(0, "<backend>")).replace("--port 0", "--port <free port>")
        return (f"{self.requirement} in {self.venv}: {self.script} {argv}; "
                f"per request {json.dumps(self.request_extra)}")


def _its_hub_argv(port: int, backend: str) -> list[str]:
    return ["--host", "127.0.0.1", "--port", str(port), "--log-level", "WARNING"]


def _its_hub_configure(url: str, backend: str, model: str) -> None:
    body = {"provider": "openai", "endpoint": backend.rstrip("/") + "/v1", "api_key": DUMMY_KEY,
            "model": model, "alg": "self-consistency", "budget": SAMPLES, "regex_patterns": [ANSWER_REGEX]}
    resp = httpx.post(url + "/configure", json=body, timeout=30, trust_env=False)
    if resp.status_code != 200:
        raise PeerError(f"its_hub POST /configure answered {resp.status_code}: {resp.text[:500]}")


def _optillm_argv(port: int, backend: str) -> list[str]:
    return ["--host", "127.0.0.1", "--port", str(port), "--base-url", backend.rstrip("/") + "/v1",
            "--approach", "majority_voting", "--log", "warning"]


def default_peers(root: Path) -> list[Peer]:
    """The two peers, with venvs under ``root`` (the repository root)."""
    return [
        Peer(name="its_hub", dist="its_hub", version="1.2.0", extras="[iaas]",
             venv=root / ".venv-peer-its-hub", script="its-iaas", health_path="/v1/models",
             request_extra={"budget": SAMPLES}, argv=_its_hub_argv, configure=_its_hub_configure),
        Peer(name="optillm", dist="optillm", version="0.4.0", extras="",
             venv=root / ".venv-peer-optillm", script="optillm", health_path="/health",
             request_extra={"k": SAMPLES}, argv=_optillm_argv,
             env={"OPENAI_API_KEY": DUMMY_KEY}, pins=(TORCH_CPU,)),
    ]


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def installed_version(peer: Peer) -> str | None:
    """The version of ``peer.dist`` in its venv, or ``None`` when the venv or the package is missing."""
    python = peer.venv / "bin" / "python"
    if not python.exists():
        return None
    code = f"import importlib.metadata as m; print(m.version({peer.dist!r}))"
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60, check=False)
    return done.stdout.strip() if done.returncode == 0 else None


def install_command(peer: Peer) -> list[str]:
    cmd = [str(peer.venv / "bin" / "pip"), "install", "-q", peer.requirement, *peer.pins]
    index = os.environ.get("TORCH_INDEX_URL")
    if index and peer.pins:
        cmd += ["--extra-index-url", index]
    return cmd


def ensure_installed(peer: Peer, *, install: bool = True, timeout_s: float = 1800) -> None:
    """Make sure ``peer``'s venv holds its pinned version and server script; raise :class:`PeerError`
    with pip's output tail when it cannot be installed."""
    if installed_version(peer) == peer.version and peer.exe().exists():
        return
    if not install:
        raise PeerError(f"{peer.name}: {peer.requirement} is not installed in {peer.venv} "
                        "and installing was disabled")
    python = sys.executable if sys.version_info[:2] == (3, 11) else "python3.11"
    for cmd in ([python, "-m", "venv", str(peer.venv)], install_command(peer)):
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired as exc:
            raise PeerError(f"{peer.name}: `{' '.join(cmd)}` did not finish in {timeout_s:.0f}s") from exc
        if done.returncode != 0:
            out = "\n".join(ln for ln in (done.stdout + done.stderr).splitlines()
                            if not ln.startswith("WARNING: Location"))
            hint = (" (torch's CPU build is not on PyPI: set TORCH_INDEX_URL to PyTorch's CPU wheel index)"
                    if any("torch" in p for p in peer.pins) and "torch" in out else "")
            raise PeerError(f"{peer.name}: `{' '.join(cmd)}` failed (exit {done.returncode}){hint}:\n"
                            f"{_tail(out)}")
    if not peer.exe().exists():
        raise PeerError(f"{peer.name}: installed {peer.requirement} but {peer.exe()} does not exist")


def _wait(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise PeerError(f"server exited with code {proc.returncode}; log tail:\n"
                            f"{_tail(log.read_text(errors='replace'))}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1, trust_env=False).status_code == 200:
                return
        time.sleep(0.3)
    raise PeerError(f"{url} did not answer within {timeout_s:.0f}s; log tail:\n"
                    f"{_tail(log.read_text(errors='replace'))}")


@contextlib.contextmanager
def running_peer(peer: Peer, backend: str, model: str, *, log_dir: Path,
                 timeout_s: float = 180, cpus: set[int] | None = None) -> Iterator[Endpoint]:
    """Start ``peer`` against ``backend`` on a free loopback port (on ``cpus`` when given), configure
    it, yield its URL, stop it. Any failure is a :class:`PeerError` naming the peer and carrying its
    log tail."""
    port = free_port()
    url = Endpoint(f"http://127.0.0.1:{port}")
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"peer-{peer.name}.log"
    env = {**os.environ, **peer.env, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    with log.open("wb") as out:
        proc = subprocess.Popen([str(peer.exe()), *peer.argv(port, backend)], stdout=out,
                                stderr=subprocess.STDOUT, env=env)
    url.pid = proc.pid
    if cpus:
        os.sched_setaffinity(proc.pid, cpus)
    try:
        try:
            _wait(url + peer.health_path, proc, log, timeout_s)
            if peer.configure is not None:
                peer.configure(url, backend, model)
        except (PeerError, httpx.HTTPError) as exc:
            raise PeerError(f"{peer.name}: could not start or configure: {exc}") from exc
        yield url
    finally:
        stop_process(proc)
