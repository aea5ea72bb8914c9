"""The sandbox: each escape a hostile program could try, with the outcome asserted, plus limits,
cancellation and availability checks."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path

import pytest

from app.sandbox import SANDBOX_ENV, Sandbox, SandboxConfig, SandboxUnavailable
from tests.support.sandboxes import ready_sandbox
from tests.support.waiting import until

pytestmark = pytest.mark.sandbox

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return ready_sandbox(SandboxConfig(cpu_s=2, wall_s=5))


def descendants(root: int) -> set[int]:
    """Pids of every live process below ``root`` (from /proc)."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier} - found
        found |= frontier
    return found


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def sandbox_processes() -> set[int]:
    """This test process's sandbox descendants (bwrap, the namespace's init, the program, its
    children: all carry /tmp/main.py in their command line); other tests' helper processes are not."""
    return {p for p in descendants(os.getpid()) if b"/tmp/main.py" in cmdline(p)}


def process_count() -> int:
    return sum(1 for e in Path("/proc").iterdir() if e.name.isdigit())


async def test_runs_a_program_with_stdin(sandbox: Sandbox) -> None:
    r = await sandbox.run("import sys\nprint(sys.stdin.read().upper())\nprint('err', file=sys.stderr)", stdin="abc")
    assert (r.status, r.returncode, r.stdout, r.stderr) == ("ok", 0, "ABC\n", "err\n")
    assert 0 < r.wall_s < 5
    r = await sandbox.run("raise SystemExit(3)")
    assert (r.status, r.returncode) == ("error", 3)
    r = await sandbox.run("def broken(:\n")
    assert r.status == "error" and "SyntaxError" in r.stderr


async def test_network_is_unreachable(sandbox: Sandbox) -> None:
    seen: list[str] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append("connection")
        writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    prog = f"""
import json, socket
out = {{}}
targets = [("host_loopback", ("127.0.0.1", {port})), ("outside", ("1.1.1.1", 53)),
           ("outside_v6", ("2606:4700:4700::1111", 53))]
for name, addr in targets:
    try:
        socket.create_connection(addr, timeout=2).close()
        out[name] = "connected"
    except OSError as e:
        out[name] = type(e).__name__
try:
    socket.getaddrinfo("example.com", 80)
    out["dns"] = "resolved"
except OSError as e:
    out["dns"] = type(e).__name__
print(json.dumps(out))
"""
    async with server:
        r = await sandbox.run(prog)
    out = json.loads(r.stdout)
    assert r.status == "ok", r
    assert out["host_loopback"] == "ConnectionRefusedError"  # the sandbox's own, empty loopback
    assert out["outside"] == "OSError" and out["outside_v6"] == "OSError"  # network unreachable
    assert out["dns"] == "gaierror"
    assert seen == []


async def test_cannot_write_outside_its_tmp(sandbox: Sandbox, tmp_path: Path) -> None:
    targets = [REPO / "escaped.txt", Path("/usr/escaped.txt"), Path("/escaped.txt"), Path("/dev/escaped"),
               tmp_path / "escaped.txt"]
    prog = f"""
import json, os
out = {{}}
for p in {[str(t) for t in targets]!r}:
    try:
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write("pwned")
        out[p] = "written"
    except OSError as e:
        out[p] = type(e).__name__
with open("/tmp/ok.txt", "w") as f:
    f.write("fine")
print(json.dumps(out))
"""
    r = await sandbox.run(prog)
    out = json.loads(r.stdout)
    assert r.status == "ok", r
    for t in targets[:4]:
        if t.is_relative_to("/tmp"):  # a checkout under /tmp: inside, that path is in the private /tmp
            continue
        assert out[str(t)] in ("OSError", "PermissionError", "FileNotFoundError"), (t, out)  # read-only root
    # the host's tmp_path does not exist inside: the program can create that path in its private
    # /tmp, but nothing reaches the host
    for t in targets:
        assert not t.exists(), t


async def test_tmp_and_file_size_are_bounded(tmp_path: Path) -> None:
    sb = ready_sandbox(SandboxConfig(tmp_size_mb=4, file_size_mb=2))
    prog = """
import json
out = {}
for name, size, n in [("big_file", 3 << 20, 1), ("fill_tmp", 1 << 20, 8)]:
    try:
        for i in range(n):
            with open(f"/tmp/{name}{i}", "wb") as f:
                f.write(b"x" * size)
        out[name] = "written"
    except OSError as e:
        out[name] = e.errno
print(json.dumps(out))
"""
    r = await sb.run(prog)
    assert json.loads(r.stdout) == {"big_file": 27, "fill_tmp": 28}  # EFBIG (RLIMIT_FSIZE), ENOSPC (tmpfs size)


async def test_environment_secrets_do_not_leak(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TTC_TEST_SECRET", "hunter2-secret")
    prog = """
import json, os
environs = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            environs.append(open(f"/proc/{pid}/environ", "rb").read().decode())
        except OSError:
            pass
print(json.dumps({"env": dict(os.environ), "proc": environs}))
"""
    r = await sandbox.run(prog)
    assert r.status == "ok", r
    assert "hunter2" not in r.stdout
    assert json.loads(r.stdout)["env"] == {**SANDBOX_ENV, "PWD": "/tmp"}  # PWD: bwrap's --chdir


async def test_host_files_are_invisible(sandbox: Sandbox, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host-secret-contents")
    secret.chmod(0o644)
    paths = [secret, REPO / "README.md", Path("/etc/passwd"), Path("/etc/hostname"), Path("/root/.bashrc"),
             Path("/proc/1/root/etc/passwd")]
    prog = f"""
import json
out = {{}}
for p in {[str(p) for p in paths]!r}:
    try:
        out[p] = open(p).read()[:100]
    except OSError as e:
        out[p] = type(e).__name__
import os
out["/"] = sorted(os.listdir("/"))
print(json.dumps(out))
"""
    r = await sandbox.run(prog)
    out = json.loads(r.stdout)
    assert r.status == "ok", r
    assert out[str(secret)] == "FileNotFoundError"
    assert out[str(REPO / "README.md")] == "FileNotFoundError"
    assert out["/etc/passwd"] == "FileNotFoundError"
    assert all(v in ("FileNotFoundError", "PermissionError") for k, v in out.items() if k != "/"), out
    assert out["/"] == ["bin", "dev", "lib", "lib64", "proc", "tmp", "usr"]


async def test_fork_bomb_is_contained() -> None:
    sb = ready_sandbox(SandboxConfig(processes=16, wall_s=2, cpu_s=2))
    before = process_count()
    peak = 0
    prog = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    task = asyncio.create_task(sb.run(prog))
    t0 = time.monotonic()
    while not task.done():
        peak = max(peak, len(sandbox_processes()))
        await asyncio.sleep(0.05)
    r = task.result()
    assert r.status in ("timeout", "error"), r
    assert peak >= 8  # it did fork (bounded below)
    assert time.monotonic() - t0 < 8
    assert peak <= 16 + 2  # the limit inside, plus the outer bwrap (setpriv execs it, no extra process)
    assert sandbox_processes() == set()
    assert process_count() <= before + 2  # back to normal (slack for unrelated host processes)
    # the limit is per sandbox: a bomb does not stop the next program from starting
    ok = await sb.run("print('after')")
    assert ok.stdout == "after\n"


async def test_fork_bomb_does_not_starve_a_concurrent_run() -> None:
    sb = ready_sandbox(SandboxConfig(processes=8, wall_s=2, max_concurrent=2))
    bomb = asyncio.create_task(sb.run("import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
                                      "        time.sleep(0.01)\n"))
    await until(lambda: len(sandbox_processes()) >= 8, what="the bomb to fork")
    r = await sb.run("import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)\nprint('ok')")
    assert (r.status, r.stdout) == ("ok", "ok\n")
    assert (await bomb).status == "timeout"


async def test_memory_hog_hits_the_limit(sandbox: Sandbox) -> None:
    r = await sandbox.run("x = bytearray(2 * 1024 ** 3)")
    assert r.status == "memory", r
    r = await sandbox.run("chunks = []\nwhile True:\n    chunks.append(bytearray(16 * 1024 * 1024))")
    assert r.status in ("memory", "error"), r
    assert r.wall_s < 5


async def test_infinite_loop_times_out() -> None:
    sandbox = ready_sandbox(SandboxConfig(cpu_s=1, wall_s=5))
    r = await sandbox.run("while True:\n    pass")
    assert (r.status, r.returncode) == ("timeout", 128 + 24)  # SIGXCPU at cpu_s=1
    assert 0.9 < r.wall_s < 3
    r = await sandbox.run("import time\ntime.sleep(60)", wall_s=0.5)  # no CPU used: the wall clock
    assert r.status == "timeout" and r.wall_s < 3
    r = await sandbox.run("import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass")
    assert r.status == "timeout" and r.returncode == 128 + 9  # the hard limit's SIGKILL


async def test_huge_output_is_cut() -> None:
    sb = ready_sandbox(SandboxConfig(output_bytes=4096))
    r = await sb.run("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)")
    assert r.status == "output_limit" and r.stdout == "x" * 4096
    assert r.wall_s < 1.5  # killed at once (a pipe left unread would stall the reaping)
    r = await sb.run("import sys\nprint('fine', flush=True)\nwhile True:\n    sys.stderr.write('y' * 65536)")
    assert r.status == "output_limit" and r.stderr == "y" * 4096 and r.stdout == "fine\n"
    r = await sb.run("print('z' * 4095)")  # exactly the cap (with the newline) is fine
    assert r.status == "ok" and len(r.stdout) == 4096


async def test_cancellation_kills_the_process_tree(sandbox: Sandbox) -> None:
    task = asyncio.create_task(sandbox.run("import os, time\nif os.fork() == 0:\n    time.sleep(60)\ntime.sleep(60)"))
    await until(lambda: len(sandbox_processes()) >= 4, what="both bwraps, the program and its child")
    pids = sandbox_processes()
    assert len(pids) >= 4  # outer bwrap, the namespace's init, the program and its child
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [p for p in pids if Path(f"/proc/{p}").exists()] == []  # gone, not even zombies


async def test_concurrency_is_bounded() -> None:
    sb = ready_sandbox(SandboxConfig(max_concurrent=1))
    t0 = time.monotonic()
    rs = await asyncio.gather(*(sb.run("import time\ntime.sleep(0.4)") for _ in range(3)))
    assert all(r.status == "ok" for r in rs)
    assert time.monotonic() - t0 >= 1.2


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (SandboxConfig(bwrap="/nonexistent/bwrap"), r"bubblewrap not found.*install bubbl.*sandbox\.mode: unsandboxed"),
        (SandboxConfig(python=Path("/nonexistent/python3")), r"sandbox\.python '/nonexistent/python3' is not an exec"),
        (SandboxConfig(mode="unsandboxed", python=Path("/nonexistent/python3")), "is not an executable"),
    ],
)
async def test_check_says_what_to_do(config: SandboxConfig, message: str) -> None:
    sb = Sandbox(config)
    with pytest.raises(SandboxUnavailable, match=message):
        sb.check()
    with pytest.raises(SandboxUnavailable, match=message):  # cached, and run() raises it too
        await sb.run("print(1)")


async def test_unsandboxed_mode_warns_and_runs(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    with caplog.at_level(logging.WARNING, logger="ttc.sandbox"):
        sb = Sandbox(SandboxConfig(mode="unsandboxed", wall_s=2))
    assert any(rec.levelno == logging.WARNING and "unsandboxed" in rec.message for rec in caplog.records)
    assert not any("unsandboxed" in rec.message for rec in caplog.records if rec.levelno < logging.WARNING)
    r = await sb.run(f"import os\nprint(sorted(os.environ) == {sorted(SANDBOX_ENV)!r})")
    assert (r.status, r.stdout) == ("ok", "True\n")
    r = await sb.run("import time\ntime.sleep(60)", wall_s=0.3)
    assert r.status == "timeout"
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ttc.sandbox"):
        Sandbox(SandboxConfig())
    assert caplog.records == []
