"""Run one untrusted Python program in a bubblewrap sandbox, with hard limits.

``await Sandbox(config).run(source, stdin=..., wall_s=..., owner=...)`` returns an :class:`ExecResult`; it
never raises for anything the program does (only :class:`SandboxUnavailable` when the sandbox
itself cannot work here, see :meth:`Sandbox.check`, and :class:`~app.sandbox_queue.SandboxBusy` /
:class:`~app.sandbox_queue.SandboxOverloaded` when its queue is full). At most ``max_concurrent``
programs run at once.

Who runs next when every slot is taken: :mod:`app.sandbox_queue`.

The command line (``mode: bwrap``)::

    [setpriv --reuid U --regid U --clear-groups --]            # only when the service is root
    bwrap --unshare-all --unshare-user --disable-userns --die-with-parent --new-session
          --clearenv --setenv PATH /usr/bin:/bin --setenv LANG C.UTF-8 --setenv PYTHONHASHSEED 0 ...
          --ro-bind /usr /usr --symlink usr/lib /lib --symlink usr/lib64 /lib64 --symlink usr/bin /bin
          --proc /proc --dev /dev --remount-ro /dev --size TMP --tmpfs /tmp
          --ro-bind-data FD /tmp/main.py --chdir /tmp --remount-ro /
          /usr/bin/prlimit --cpu=S:S+1 --as=M --nproc=N --fsize=F --core=0 --nofile=256 --
          PYTHON -S -P -B /tmp/main.py

Why each part:

* Namespaces: ``--unshare-all`` gives a network namespace with only its own loopback (no route
  out, and 127.0.0.1 is not the host's), a pid namespace (the program sees only itself; when the
  namespace's init dies the kernel kills everything in it), ipc, uts and cgroup. ``--unshare-user
  --disable-userns`` runs it in a user namespace it cannot nest (no second user namespace to
  regain capabilities in). bwrap keeps no capabilities for the program.
* Filesystem: a fresh root holding only ``/usr`` (read-only; Debian's Python and its stdlib live
  there), the usual ``/lib`` symlinks, a private ``/proc``, a minimal ``/dev`` (null, zero,
  urandom, ...) and a ``tmp_size_mb`` tmpfs at ``/tmp``. The root and ``/dev`` are remounted
  read-only, so ``/tmp`` is the only writable place and it is size-bounded (an unbounded tmpfs
  would be a way to eat the host's memory). No ``/etc``: the stdlib runs without it (no DNS, no
  passwd lookups, UTC).
* The program travels in a memfd that bwrap copies into a read-only ``/tmp/main.py``
  (``--ro-bind-data``): no host temp file that the sandbox uid would need to read, no argv size
  limit (``-c`` caps one argument at 128 KiB and shows the source in ``ps``), and stdin stays free
  for the program's input.
* Python flags: ``-S`` (no ``site``: no ``.pth`` code, no dist-packages, the same modules whatever
  is installed on the host; ``exit()``/``quit()`` builtins are therefore absent, ``sys.exit``
  works), ``-P`` (the script directory is not on ``sys.path``), ``-B`` (no bytecode). Not ``-I``:
  it implies ``-E``, which would ignore ``PYTHONHASHSEED=0``; the environment is cleared anyway,
  so ``-E`` buys nothing, and a fixed hash seed makes ``repr`` of sets stable across runs.
* Limits: ``prlimit`` (util-linux) applies the rlimits *inside* the sandbox, just before exec.
  Not ``preexec_fn``: Python code between fork and exec is unsafe in a threaded process (the
  service runs worker threads). Not ``prlimit`` outside bwrap: RLIMIT_NPROC counts every task of
  the real uid, so a limit set outside would be shared by all concurrent sandboxes (one fork bomb
  makes the next bwrap fail with EAGAIN, measured) and, when the service is not root, by the
  service's own threads. Set inside the user namespace, the kernel counts only that namespace's
  tasks. The program cannot raise them (no CAP_SYS_RESOURCE). RLIMIT_CPU has soft ``cpu_s``
  (SIGXCPU) and hard ``cpu_s + 1`` (SIGKILL).
* uid: RLIMIT_NPROC is not enforced for root, so a root service first drops to ``uid`` with
  ``setpriv`` (which execs bwrap: same pid, nothing in between).
* Killing: the host sees ``bwrap`` (our child), its child ``bwrap`` (init of the pid namespace)
  and below it the program. On a wall timeout, output overflow or cancellation we SIGKILL the
  namespace's init (found through ``/proc``, signalled through a pidfd so a reused pid is never
  hit): the kernel kills the whole namespace, the outer bwrap reaps it and exits, we reap that.
  Killing the outer bwrap first would orphan the init as a zombie of the host's pid 1.
  ``--die-with-parent`` covers a service that dies.

Status: ``timeout`` (wall timeout, SIGXCPU, or SIGKILL after at least ``cpu_s`` of wall time),
``memory`` (the last stderr line is a ``MemoryError``), ``output_limit`` (stdout or stderr passed
``output_bytes``: killed, both truncated), ``sandbox_error`` (bwrap itself failed: its message
is on stderr), else ``ok`` for exit status 0 and ``error`` otherwise. A program killed by signal
S reports ``returncode`` 128 + S (as bwrap relays it). A program can fake its own status (e.g.
print ``MemoryError``); that changes nothing but its own result.

``mode: unsandboxed`` runs ``[setpriv ...] prlimit ... PYTHON -S -P -B main.py`` in a private
temp directory (owned by the uid it runs as) with the same cleared environment: CPU, memory and
file-size limits only (no NPROC: outside a user namespace it would count every task of the uid,
the service's own threads included), no namespaces, as ``uid`` when the service is root, else as
the service's user, seeing everything that user can see. It exists for machines
without user namespaces and must be chosen explicitly; building such a Sandbox logs a warning.

Cost per candidate on this machine (2 cores, bwrap 0.8.0, Debian Python 3.11, service as root so
with setpriv), through :meth:`Sandbox.run`, median of 20 sequential runs, three repetitions: an
empty program 14-20 ms (about 17; a bare ``python3 -S -c ''`` is 10.5 ms, so bwrap's namespaces
and mounts plus setpriv and prlimit add about 7 ms); HumanEval/0's tests through the harness
about 33 ms. 100 empty programs, two at a time: 1.3 s. Under load (``ttc bench sandbox``, the same
2 cores with other test suites keeping them 100% busy, load average 3.7-4.7): 37 / 17 / 17 ms per empty
program at 1 / 2 / 4 at once, 110 / 56 / 33 ms per HumanEval/0 run (a bare ``python3 -S`` start: 7 ms).
What bounds it is CPU: a run is a few process starts (setpriv, two bwraps, prlimit, Python), namespace and
mount set-up, and the program; on a machine with no idle core every run waits for one (the 171 ms per
HumanEval program once measured here with 2 at once was such a machine).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from app.procs import children
from app.sandbox_queue import FairSlots

log = logging.getLogger("ttc.sandbox")

ExecStatus = Literal["ok", "error", "timeout", "memory", "output_limit", "sandbox_error"]

PRLIMIT = "/usr/bin/prlimit"  # inside the sandbox; /usr is the only host directory it sees
SANDBOX_ENV = {
    "PATH": "/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONHASHSEED": "0",
    "PYTHONIOENCODING": "utf-8",
}
_PROBE = "print(6 * 7)"
_KILL_GRACE_S = 2.0
_KILL_POLL_S = 0.02


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot run here (bwrap missing, no user namespaces, interpreter missing)."""


class SandboxConfig(BaseModel):
    """How untrusted programs run (see the module docstring for the command line)."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["bwrap", "unsandboxed"] = Field(
        "bwrap", description="bwrap (namespaces + rlimits); unsandboxed runs with rlimits only and must be explicit"
    )
    bwrap: str = Field("bwrap", description="the bubblewrap binary: a path, or a name looked up on PATH")
    python: Path = Field(
        Path("/usr/bin/python3"),
        description="interpreter candidates run with; under /usr in bwrap mode (the only host directory mounted)",
    )
    cpu_s: int = Field(5, ge=1, le=600, description="RLIMIT_CPU seconds (SIGXCPU at cpu_s, SIGKILL one second later)")
    memory_mb: int = Field(512, ge=32, le=65536, description="RLIMIT_AS in MiB")
    processes: int = Field(32, ge=1, le=4096, description="RLIMIT_NPROC: tasks inside one sandbox")
    file_size_mb: int = Field(16, ge=0, le=4096, description="RLIMIT_FSIZE in MiB (largest file it may write)")
    tmp_size_mb: int = Field(64, ge=1, le=4096, description="size of the private tmpfs at /tmp in MiB")
    wall_s: float = Field(10.0, gt=0, le=600, description="wall-clock limit per run in seconds")
    output_bytes: int = Field(
        64 * 1024, ge=1024, le=64 << 20, description="bytes of stdout and of stderr kept; beyond it the run is killed"
    )
    max_concurrent: int = Field(2, ge=1, le=256, description="programs running at once")
    max_queued_per_key: int = Field(
        128, ge=0, le=1_000_000, description="programs of one API key waiting for a slot; one more is refused with a "
        "429 (one request's candidates and behaviour probes: up to twice limits.max_samples)")
    max_queued: int = Field(
        1024, ge=0, le=1_000_000, description="programs of all API keys together waiting for a slot; one more is "
        "refused with a 503 (programs without a key, auth off or offline, wait without a limit)")
    max_running_per_key: int | None = Field(
        None, ge=1, le=256, description="slots one API key holds at once (None: all; waiting keys get freed slots "
        "round-robin either way)")
    uid: int = Field(65534, ge=1, description="uid (and gid) candidates run as when the service runs as root")


@dataclass(frozen=True, slots=True)
class ExecResult:
    """What one run did. ``stdout``/``stderr`` are decoded (UTF-8, errors replaced) and truncated to
    ``output_bytes``; ``returncode`` is None when the process could not be started."""

    status: ExecStatus
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    turns_waited: int = 0
    """Programs that started while this one waited for its slot."""


class Sandbox:
    """Runs untrusted Python programs under :class:`SandboxConfig`'s limits."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config if config is not None else SandboxConfig()
        self.slots = FairSlots(self.config)
        self._checked = False
        self._unavailable: SandboxUnavailable | None = None
        self._check_lock = asyncio.Lock()
        if self.config.mode == "unsandboxed":
            log.warning(
                "sandbox.mode is 'unsandboxed': untrusted programs run with rlimits only (as sandbox.uid when the "
                "service is root, else as its user), with access to the host's files and network"
            )

    # --- availability -----------------------------------------------------------------------

    def check(self) -> None:
        """Raise :class:`SandboxUnavailable` (with what to do) when programs cannot run here.

        Resolves the binaries and runs one tiny probe program through the real command line; the
        outcome is cached, so only the first call costs a process (~20 ms).
        """
        if not self._checked:
            self._unavailable = self._probe()
            self._checked = True
        if self._unavailable is not None:
            raise self._unavailable

    def _probe(self) -> SandboxUnavailable | None:
        cfg = self.config
        unsafe = "or set sandbox.mode: unsandboxed explicitly (untrusted code then runs without isolation)"
        hint = f"install bubblewrap (apt-get install bubblewrap), {unsafe}"
        if not cfg.python.is_file() or not os.access(cfg.python, os.X_OK):
            return SandboxUnavailable(f"sandbox.python {str(cfg.python)!r} is not an executable file")
        if cfg.mode == "bwrap":
            if shutil.which(cfg.bwrap) is None:
                return SandboxUnavailable(f"bubblewrap not found (sandbox.bwrap = {cfg.bwrap!r}): {hint}")
            if not cfg.python.resolve().is_relative_to("/usr"):
                return SandboxUnavailable(
                    f"sandbox.python {str(cfg.python)!r} is outside /usr, the only host directory the sandbox mounts"
                )
            tools = [PRLIMIT, *(["/usr/bin/setpriv"] if os.geteuid() == 0 else [])]
            missing = [t for t in tools if not Path(t).is_file()]
            if missing:
                return SandboxUnavailable(f"{', '.join(missing)} missing: install util-linux")
        elif not Path(PRLIMIT).is_file():
            return SandboxUnavailable(f"{PRLIMIT} missing: install util-linux")
        with _ProgramFile(_PROBE, self._needs_dir(), self._owner()) as prog:
            argv, pass_fds = self._argv(prog)
            try:
                done = subprocess.run(
                    argv, pass_fds=pass_fds, cwd=prog.cwd, env=self._host_env(prog.cwd), stdin=subprocess.DEVNULL,
                    capture_output=True, timeout=max(10.0, self.config.wall_s), check=False,
                )
            except (OSError, subprocess.TimeoutExpired) as e:
                return SandboxUnavailable(f"the sandbox probe could not run ({e}): {hint}")
        if done.returncode == 0 and done.stdout.strip() == b"42":
            return None
        detail = (done.stderr or done.stdout).decode("utf-8", "replace").strip()[-500:]
        if cfg.mode == "bwrap":
            return SandboxUnavailable(
                f"bubblewrap cannot create its sandbox here (exit {done.returncode}: {detail}). It needs unprivileged "
                "user namespaces (sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0; in a "
                f"container a seccomp/AppArmor profile that allows them), {unsafe}"
            )
        return SandboxUnavailable(f"the unsandboxed probe failed (exit {done.returncode}: {detail})")

    async def _ensure_checked(self) -> None:
        if not self._checked:
            async with self._check_lock:
                if not self._checked:
                    await asyncio.to_thread(self.check)
        self.check()

    # --- running ----------------------------------------------------------------------------

    async def run(self, source: str, *, stdin: str | None = None, wall_s: float | None = None,
                  owner: str | None = None) -> ExecResult:
        """Run ``source`` as ``main.py`` with ``stdin`` (empty when None) under the limits, in a slot
        shared fairly between owners (API keys; see the module doc).

        Cancelling the awaiting task kills the whole process tree before the cancellation
        propagates. Raises :class:`SandboxUnavailable` when :meth:`check` fails,
        :class:`~app.sandbox_queue.SandboxBusy` or :class:`~app.sandbox_queue.SandboxOverloaded` when the
        program would wait behind a full queue.
        """
        await self._ensure_checked()
        limit = self.config.wall_s if wall_s is None else min(wall_s, 600.0)
        turns = await self.slots.acquire(owner)
        try:
            result = await self._run(source, stdin, limit)
        finally:
            self.slots.release(owner)
        return replace(result, turns_waited=turns) if turns else result

    async def _run(self, source: str, stdin: str | None, limit: float) -> ExecResult:
        cap = self.config.output_bytes
        out, err = bytearray(), bytearray()
        overflow = asyncio.Event()
        with _ProgramFile(source, self._needs_dir(), self._owner()) as prog:
            argv, pass_fds = self._argv(prog)
            start = time.monotonic()
            try:
                proc = await self._start(argv, pass_fds, prog.cwd)
            except OSError as e:
                return ExecResult("sandbox_error", None, "", f"could not start the sandbox: {e}", 0.0)
            prog.close_fds()
            assert proc.stdout is not None and proc.stderr is not None
            tasks = [
                asyncio.create_task(_read_capped(proc.stdout, out, cap, overflow)),
                asyncio.create_task(_read_capped(proc.stderr, err, cap, overflow)),
                asyncio.create_task(_feed(proc, stdin)),
            ]
            finished = asyncio.create_task(_wait_all(proc, tasks[:2]))
            overflowed = asyncio.create_task(overflow.wait())
            try:
                done, _ = await asyncio.wait({finished, overflowed}, timeout=limit, return_when="FIRST_COMPLETED")
                timed_out = not done
                if proc.returncode is None:
                    await self._kill(proc)
                # the pipes close once the tree is dead; only an escaped process (unsandboxed) keeps them open
                await asyncio.wait({finished}, timeout=_KILL_GRACE_S)
            except BaseException:
                await asyncio.shield(self._kill(proc))
                raise
            finally:
                for t in (*tasks, finished, overflowed):
                    t.cancel()
            wall = time.monotonic() - start
        rc = _returncode(proc.returncode)
        stdout, stderr = bytes(out).decode("utf-8", "replace"), bytes(err).decode("utf-8", "replace")
        return ExecResult(self._status(rc, stderr, timed_out, overflow.is_set(), wall), rc, stdout, stderr, wall)

    async def _start(self, argv: list[str], pass_fds: tuple[int, ...], cwd: str | None) -> asyncio.subprocess.Process:
        """Start the outer bwrap. Cancelled meanwhile, it still waits for the process (asyncio would only kill
        the outer bwrap, orphaning the namespace it may already have made) and kills the whole tree."""
        starting = asyncio.ensure_future(asyncio.create_subprocess_exec(
            *argv, pass_fds=pass_fds, cwd=cwd, env=self._host_env(cwd), start_new_session=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        ))
        try:
            return await asyncio.shield(starting)
        except asyncio.CancelledError:
            with contextlib.suppress(OSError):
                await asyncio.shield(self._reap(starting))
            raise

    async def _reap(self, starting: asyncio.Future[asyncio.subprocess.Process]) -> None:
        proc = await starting
        # wait() returns once the pipes are closed, so they are read to their end (a full buffer stops reading)
        drains = [asyncio.ensure_future(_drain(pipe)) for pipe in (proc.stdout, proc.stderr) if pipe is not None]
        try:
            await self._kill(proc)
        finally:
            for drain in drains:
                drain.cancel()

    def _status(self, rc: int | None, stderr: str, timed_out: bool, overflow: bool, wall: float) -> ExecStatus:
        if overflow:
            return "output_limit"
        if timed_out or rc == 128 + signal.SIGXCPU or (rc == 128 + signal.SIGKILL and wall >= self.config.cpu_s):
            return "timeout"
        if rc == 0:
            return "ok"
        lines = stderr.strip().splitlines()
        if lines and lines[-1].startswith("MemoryError"):
            return "memory"
        if self.config.mode == "bwrap" and rc == 1 and stderr.startswith("bwrap: "):
            return "sandbox_error"
        return "error"

    async def _kill(self, proc: asyncio.subprocess.Process) -> None:
        """Kill the tree under ``proc`` and reap ``proc`` (see the module docstring for the order). Until the
        outer bwrap exits, the namespace's init is killed whenever one is there: a run cancelled while bwrap
        starts up has no init yet, and the one bwrap forks a moment later would otherwise run on as an
        orphan (its parent-death signal not set yet), the program inside holding our pipes open."""
        if self.config.mode == "bwrap":
            loop = asyncio.get_running_loop()
            end = loop.time() + _KILL_GRACE_S
            while proc.returncode is None and loop.time() < end:
                for pid in children(proc.pid):
                    _kill_pid(pid, proc.pid)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(proc.wait(), _KILL_POLL_S)
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()

    # --- command line -------------------------------------------------------------------------

    def _needs_dir(self) -> bool:
        return self.config.mode == "unsandboxed"

    def _owner(self) -> int | None:
        """The uid programs run as when it is not ours (a root service drops to ``config.uid``)."""
        return self.config.uid if os.geteuid() == 0 else None

    def _limits(self, *, nproc: bool) -> list[str]:
        c = self.config
        mib = 1024 * 1024
        limits = [f"--cpu={c.cpu_s}:{c.cpu_s + 1}", f"--as={c.memory_mb * mib}", f"--fsize={c.file_size_mb * mib}",
                  "--core=0", "--nofile=256"]
        if nproc:
            limits.append(f"--nproc={c.processes}")
        return [PRLIMIT, *limits, "--"]

    def _host_env(self, cwd: str | None) -> dict[str, str]:
        """bwrap mode: what setpriv/bwrap need (the sandbox's own environment is set by --setenv)."""
        if self.config.mode == "unsandboxed" and cwd is not None:
            return {**SANDBOX_ENV, "HOME": cwd, "TMPDIR": cwd}
        return {"PATH": "/usr/bin:/bin"}

    def _argv(self, prog: _ProgramFile) -> tuple[list[str], tuple[int, ...]]:
        c = self.config
        python = [str(c.python), "-S", "-P", "-B"]
        argv: list[str] = []
        if os.geteuid() == 0:
            argv += ["/usr/bin/setpriv", f"--reuid={c.uid}", f"--regid={c.uid}", "--clear-groups", "--"]
        if c.mode == "unsandboxed":
            return [*argv, *self._limits(nproc=False), *python, "main.py"], ()
        assert prog.fd is not None
        argv += [shutil.which(c.bwrap) or c.bwrap, "--unshare-all", "--unshare-user", "--disable-userns",
                 "--die-with-parent", "--new-session", "--clearenv"]
        for k, v in SANDBOX_ENV.items():
            argv += ["--setenv", k, v]
        argv += ["--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
                 "--symlink", "usr/bin", "/bin", "--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev",
                 "--size", str(c.tmp_size_mb * 1024 * 1024), "--tmpfs", "/tmp",
                 "--ro-bind-data", str(prog.fd), "/tmp/main.py", "--chdir", "/tmp", "--remount-ro", "/"]
        return [*argv, *self._limits(nproc=True), *python, "/tmp/main.py"], (prog.fd,)


class _ProgramFile:
    """The program's source: a memfd (bwrap mode) or ``main.py`` in a private temp dir."""

    def __init__(self, source: str, as_dir: bool, owner: int | None) -> None:
        self.fd: int | None = None
        self.cwd: str | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        data = source.encode("utf-8", "surrogatepass")
        if as_dir:
            self._tmp = tempfile.TemporaryDirectory(prefix="ttc-sandbox-")
            self.cwd = self._tmp.name
            Path(self.cwd, "main.py").write_bytes(data)
            if owner is not None:  # the dropped uid must be able to work in its own directory
                os.chown(self.cwd, owner, owner)
        else:
            self.fd = os.memfd_create("main.py", os.MFD_CLOEXEC)
            _write_all(self.fd, data)
            os.lseek(self.fd, 0, os.SEEK_SET)

    def close_fds(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> _ProgramFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close_fds()
        if self._tmp is not None:
            self._tmp.cleanup()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


async def _read_capped(stream: asyncio.StreamReader, buf: bytearray, cap: int, overflow: asyncio.Event) -> None:
    """Append up to ``cap`` bytes of ``stream`` to ``buf``; set ``overflow`` when there is more.

    Past the cap it keeps reading (and dropping) until EOF: asyncio's ``Process.wait()`` returns
    only once every pipe is closed, and a pipe nobody reads never gets to its EOF.
    """
    while chunk := await stream.read(65536):
        room = cap - len(buf)
        if len(chunk) > room:
            buf += chunk[:room]
            overflow.set()
        else:
            buf += chunk


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.read(65536):
        pass


async def _wait_all(proc: asyncio.subprocess.Process, readers: list[asyncio.Task[None]]) -> None:
    await asyncio.gather(*readers)
    await proc.wait()


async def _feed(proc: asyncio.subprocess.Process, stdin: str | None) -> None:
    assert proc.stdin is not None
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        if stdin:
            proc.stdin.write(stdin.encode("utf-8", "surrogatepass"))
            await proc.stdin.drain()
        proc.stdin.close()


def _returncode(rc: int | None) -> int | None:
    return 128 - rc if rc is not None and rc < 0 else rc


def _kill_pid(pid: int, parent: int) -> None:
    """SIGKILL ``pid`` through a pidfd, after checking that it is still ``parent``'s child."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        if pid in children(parent):  # the pidfd now pins the process we checked
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(pidfd)
