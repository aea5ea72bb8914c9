"""Peer configuration and failure reporting (no peer is installed or started here)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from ttc_tools.fakes.service import FakeTTCService, serve_in_thread
from ttc_tools.loadtest.bench_peers import PeersReport, System, compare, synthetic_problems, verdicts
from ttc_tools.loadtest.peers import (
    SAMPLES,
    Peer,
    PeerError,
    default_peers,
    ensure_installed,
    install_command,
    running_peer,
)


def test_default_peers_are_configured_for_8_sample_majority_vote(tmp_path: Path) -> None:
    its, opt = default_peers(tmp_path)
    assert its.requirement == "its_hub[iaas]==1.2.0" and opt.requirement == "optillm==0.4.0"
    assert its.request_extra == {"budget": SAMPLES} and opt.request_extra == {"k": SAMPLES}
    assert SAMPLES == 8
    argv = opt.argv(1234, "http://127.0.0.1:9")
    assert argv[argv.index("--approach") + 1] == "majority_voting"
    assert argv[argv.index("--base-url") + 1] == "http://127.0.0.1:9/v1"
    assert "127.0.0.1" in its.argv(1, "x") and its.venv == tmp_path / ".venv-peer-its-hub"
    assert "majority_voting" in opt.description()
    assert install_command(opt)[-2:] == ["optillm==0.4.0", "torch==2.13.0+cpu"] or \
        "--extra-index-url" in install_command(opt)


def test_missing_peer_without_install_says_why(tmp_path: Path) -> None:
    peer = default_peers(tmp_path)[0]
    with pytest.raises(PeerError, match=r"not installed .* installing was disabled"):
        ensure_installed(peer, install=False)


def test_peer_that_dies_at_start_reports_its_log(tmp_path: Path) -> None:
    exe = tmp_path / "venv" / "bin" / "broken"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\necho 'ImportError: no module named flask' >&2\nexit 3\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    peer = Peer(name="broken", dist="broken", version="1", extras="", venv=tmp_path / "venv",
                script="broken", health_path="/health", request_extra={}, argv=lambda p, b: [])
    with pytest.raises(PeerError, match=r"(?s)exited with code 3.*no module named flask"), \
            running_peer(peer, "http://127.0.0.1:9", "m", log_dir=tmp_path / "logs", timeout_s=10):
        pass


def test_compare_interleaves_systems_and_reports_ratios() -> None:
    import asyncio

    from rich.console import Console

    with serve_in_thread(FakeTTCService(latency_s=0.0)) as fast, \
            serve_in_thread(FakeTTCService(latency_s=0.1)) as slow:
        systems = [System("direct", fast), System("ttc", fast, ttc={"policy": "self-consistency-8"}),
                   System("peer", slow, extra_body={"k": 8})]
        sums = asyncio.run(compare(systems, synthetic_problems(10), target="fake", model="m", levels=[2],
                                   duration_s=0.4, slices=2, max_tokens=None, timeout_s=5,
                                   console=Console(quiet=True)))
    rows = {r["system"]: r for r in PeersReport("fake", sums, {}).rows()}
    assert set(rows) == {"direct", "ttc", "peer"}
    assert rows["peer"]["ttc_rps_ratio"] > 1.5
    assert rows["ttc"]["ttc_rps_ratio"] is None and rows["direct"]["added_p50_ms"] is None
    assert rows["peer"]["added_p50_ms"] > 50
    lines = verdicts(PeersReport("fake", sums, {}), target_ratio=1.5)
    assert "vs peer" in lines[0] and "target >= 1.5x: met" in lines[0] and "backend's own" in lines[1]
