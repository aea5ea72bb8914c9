"""What ``ttc loadtest`` and ``ttc bench latency`` send: ``--priority`` as ``ttc.priority`` with every
request (never when not given; a value other than latency/tokens refused before any load), and one
policy check per policy name, not one per slice."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from typer.testing import CliRunner

from tests.support.cli import app_of
from ttc_tools.bench.latency import measure, plan
from ttc_tools.fakes.service import FakeTTCService, serve_in_thread
from ttc_tools.loadtest.cli import register
from ttc_tools.loadtest.data import Problem
from ttc_tools.loadtest.runner import LevelSpec


def sent(service: FakeTTCService) -> list[dict[str, Any]]:
    """The ``ttc`` object of every request posted to ``service``."""
    return [body.get("ttc") or {} for method, _, body in service.received if method == "POST"]


def _cli() -> typer.Typer:
    return app_of(register)


def test_loadtest_sends_the_priority_with_every_request_and_only_when_given(tmp_path: Path) -> None:
    data = tmp_path / "p.jsonl"
    data.write_text("\n".join(json.dumps({"question": f"Report {i}.", "answer": str(i)}) for i in range(4)))
    service = FakeTTCService(latency_s=0.0, p_correct=1.0)
    with serve_in_thread(service) as url:
        def run(*extra: str) -> Any:
            return CliRunner().invoke(_cli(), ["loadtest", "--url", url, "--data", str(data),
                                               "--policy", "single,default", "--concurrency", "1",
                                               "--requests", "3", "--out", str(tmp_path / "out"), *extra])
        given = run("--priority", "tokens")
        assert given.exit_code == 0, given.output
        assert len(sent(service)) == 6 and all(t["priority"] == "tokens" for t in sent(service))
        assert {t["policy"] for t in sent(service)} == {"single", "default"}
        service.received.clear()
        assert run().exit_code == 0
        assert len(sent(service)) == 6 and not any("priority" in t for t in sent(service))
        service.received.clear()
        wrong = run("--priority", "cheap")
        assert wrong.exit_code == 2 and "--priority" in wrong.output and not service.received


def test_bench_latency_slices_keep_the_priority_beside_each_policy() -> None:
    base = LevelSpec(url="http://127.0.0.1:1", policy="", mode="closed", load=1, duration_s=10.0,
                     ttc={"priority": "tokens"})
    problems = [Problem(f"p{i}", f"Q{i}", str(i)) for i in range(4)]
    planned = plan([("sc", {"allocator": "fixed"}), ("calibrated", "calibrated")], [4], 2, problems, base)
    assert [s.ttc for s, _ in planned] == [{"priority": "tokens", "policy": {"allocator": "fixed"}},
                                          {"priority": "tokens", "policy": "calibrated"}] * 2
    assert base.ttc == {"priority": "tokens"}  # the base is not changed by the slices built from it


def test_bench_latency_asks_for_each_policy_once_before_its_slices() -> None:
    service = FakeTTCService(latency_s=0.0, p_correct=1.0)
    problems = [Problem(f"p{i}", f"Report {i}.", str(i)) for i in range(6)]
    with serve_in_thread(service) as url:
        rows = asyncio.run(measure(url, [("single", "single"), ("default", "default"), ("sc", {"allocator": "fixed"})],
                                   [1], duration_s=0.6, slices=3, problems=problems, backend_metrics=[], model=None,
                                   temperature=None, timeout_s=5.0, console=Console(quiet=True)))
    assert {r.policy for r in rows} == {"single", "default", "sc"} and all(r.requests > 0 for r in rows)
    gets = sorted(path for method, path, _ in service.received if method == "GET")
    assert gets == ["/v1/policies/default", "/v1/policies/single"]  # 3 slices, one check each
