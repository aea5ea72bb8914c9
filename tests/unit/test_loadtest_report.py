"""Report files and the ``loadtest`` command end to end against a fake service."""

from __future__ import annotations

import base64
import csv
import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from tests.support.cli import app_of
from ttc_tools.fakes.service import FakeTTCService, serve_in_thread
from ttc_tools.loadtest.cli import register
from ttc_tools.loadtest.records import RequestRecord
from ttc_tools.loadtest.report import summary_table, write_reports
from ttc_tools.loadtest.stats import summarize


def _records(policy: str, n: int, correct_every: int) -> list[RequestRecord]:
    return [RequestRecord(policy=policy, mode="closed", load=1, index=i, problem_id=str(i), gold="1",
                          start_s=i * 0.1, end_s=i * 0.1 + 0.05, latency_s=0.05, ttfb_s=0.01,
                          samples=4, completion_tokens=30 + i, correct=i % correct_every == 0,
                          content="The answer is 1.")
            for i in range(n)]


def test_write_reports_creates_every_file(tmp_path: Path) -> None:
    recs_a, recs_b = _records("a", 10, 2), _records("b", 10, 1)
    sums = [summarize(recs_a, policy="a", mode="closed", load=1, elapsed_s=1.0),
            summarize(recs_b, policy="b", mode="open", load=5, elapsed_s=1.0)]
    files = write_reports(tmp_path / "rep", sums, recs_a + recs_b, {"target": "http://127.0.0.1:1"})
    assert {p.name for p in files.values()} == {"summary.json", "summary.csv", "requests.csv", "pareto.png",
                                                 "latency_vs_load.png", "report.html"}
    data = json.loads(files["summary.json"].read_text())
    assert data["meta"]["target"] == "http://127.0.0.1:1" and len(data["levels"]) == 2
    assert data["levels"][1]["accuracy"] == 1.0
    with files["requests.csv"].open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 20 and "content" not in rows[0]
    for name in ("pareto.png", "latency_vs_load.png"):
        assert files[name].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = files["report.html"].read_text()
    png_b64 = base64.b64encode(files["pareto.png"].read_bytes()).decode()
    assert png_b64 in html and "<table>" in html and "http://" not in html.split("<pre>")[0]
    assert summary_table(sums).row_count == 2


def _cli() -> typer.Typer:
    return app_of(register)


def test_loadtest_command_end_to_end(tmp_path: Path) -> None:
    data = tmp_path / "p.jsonl"
    data.write_text("\n".join(json.dumps({"question": f"Report {i}.", "answer": str(i)}) for i in range(8)))
    out = tmp_path / "out"
    with serve_in_thread(FakeTTCService(latency_s=0.01, p_correct=1.0)) as url:
        res = CliRunner().invoke(_cli(), [
            "loadtest", "--url", url, "--data", str(data), "--policy", "single,self-consistency-4",
            "--concurrency", "1,2", "--rate", "20", "--duration", "0.3", "--requests", "5",
            "--deadline-ms", "5000", "--out", str(out)])
    assert res.exit_code == 0, res.output
    levels = json.loads((out / "summary.json").read_text())["levels"]
    assert [(lv["policy"], lv["mode"], lv["load"]) for lv in levels] == [
        ("single", "closed", 1), ("self-consistency-4", "closed", 1), ("single", "closed", 2),
        ("self-consistency-4", "closed", 2), ("single", "open", 20), ("self-consistency-4", "open", 20)]
    assert all(lv["failed"] == 0 and lv["accuracy"] == 1.0 and lv["requests"] <= 5 for lv in levels)
    assert (out / "report.html").exists()


def test_loadtest_command_refuses_non_loopback_and_unbounded(tmp_path: Path) -> None:
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"question": "q", "answer": "1"}))
    res = CliRunner().invoke(_cli(), ["loadtest", "--url", "http://192.168.0.10:8000", "--data", str(data)])
    assert res.exit_code != 0 and "not loopback" in res.output
    res = CliRunner().invoke(_cli(), ["loadtest", "--url", "http://127.0.0.1:1", "--data", str(data),
                                      "--kill-backend-after", "1"])
    assert res.exit_code != 0 and "--kill-pid" in res.output
