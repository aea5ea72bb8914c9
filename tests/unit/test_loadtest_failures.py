"""``ttc loadtest`` when requests fail: the errors first, nothing measured over zero successes, a
non-zero exit when a level had no successful request, and a warning when too few succeeded."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import typer
from starlette.types import Receive, Scope, Send
from typer.testing import CliRunner

from tests.support.cli import app_of
from ttc_tools.fakes.service import FakeTTCService, serve_in_thread
from ttc_tools.loadtest.cli import register
from ttc_tools.loadtest.data import Problem
from ttc_tools.loadtest.records import RequestRecord, clip, error_message
from ttc_tools.loadtest.report import error_table, summary_table
from ttc_tools.loadtest.runner import LevelSpec, run_level
from ttc_tools.loadtest.stats import MIN_OK_FOR_INTERVAL, level_warnings, summarize


class PartlyBroken:
    """The fake service, except that requests naming policy ``broken`` get a 500 error envelope."""

    def __init__(self) -> None:
        self.fake = FakeTTCService(latency_s=0.0, p_correct=1.0)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            msg = await receive()
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body"):
                break
        body = json.loads(b"".join(chunks))
        if (body.get("ttc") or {}).get("policy") == "broken":
            data = json.dumps({"error": {"message": "backend [pool] exhausted: 0 of 2 backends up",
                                         "type": "server_error", "code": "backends_down"}}).encode()
            await send({"type": "http.response.start", "status": 500,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": data})
            return
        replay = iter([{"type": "http.request", "body": b"".join(chunks), "more_body": False}])

        async def again() -> Any:
            return next(replay)

        await self.fake(scope, again, send)


def _cli() -> typer.Typer:
    return app_of(register)


def _data(tmp_path: Path) -> Path:
    data = tmp_path / "p.jsonl"
    data.write_text("\n".join(json.dumps({"question": f"Report {i}.", "answer": str(i)}) for i in range(8)))
    return data


def test_a_level_without_any_success_fails_loudly_with_the_errors_first(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with serve_in_thread(PartlyBroken()) as url:
        res = CliRunner().invoke(_cli(), [
            "loadtest", "--url", url, "--data", str(_data(tmp_path)), "--policy", "single,broken",
            "--concurrency", "2", "--requests", "6", "--duration", "30", "--out", str(out)])
    assert res.exit_code == 1, res.output
    text = res.output
    # the breakdown comes first, with the error type and what the service said (markup kept literal)
    assert text.index("Failed requests") < text.index("Load test of")
    assert "http_500:backends_down" in text and "backend [pool] exhausted: 0 of 2 backends up" in text
    assert "6 of 6 failed" in text
    assert "error: 1 of 2 level(s) had no successful request (broken · closed 2 clients)" in text
    levels = {lv["policy"]: lv for lv in json.loads((out / "summary.json").read_text())["levels"]}
    dead, alive = levels["broken"], levels["single"]
    assert dead["ok"] == 0 and dead["failed"] == 6
    for key in ("latency_p50_ms", "latency_p99_ms", "ttfb_p50_ms", "samples_per_query", "accuracy",
                "accuracy_ci_low", "accuracy_ci_high"):
        assert dead[key] is None, key
    assert dead["error_examples"] == {"http_500:backends_down": "backend [pool] exhausted: 0 of 2 backends up"}
    assert alive["ok"] == 6 and alive["accuracy"] == 1.0 and alive["latency_p50_ms"] > 0
    # the table's row of the dead level shows dashes, never a 0.00 ms latency or a 0.000 accuracy
    header = next(line for line in text.splitlines() if "p50 ms" in line)
    row = [line for line in text.splitlines() if line.startswith("│ broken ")][-1]  # the last table's
    cells = dict(zip([c.strip() for c in header.strip("┃").split("┃")],
                     [c.strip() for c in row.strip("│").split("│")], strict=True))
    for column in ("p50 ms", "p90 ms", "p99 ms", "max ms", "ttfb p50", "samples/q", "tokens/q", "acc", "acc 95% CI"):
        assert cells[column] == "-", column
    assert cells["rps"] == "0.00" and cells["failed"] == "6"  # what is true over zero successes stays
    assert (out / "report.html").read_text().count("backends_down") >= 2  # breakdown and table


def test_every_request_failing_exits_non_zero(tmp_path: Path) -> None:
    """The same through the plain fake service: a deadline it cannot meet fails every request."""
    with serve_in_thread(FakeTTCService(latency_s=0.02)) as url:
        res = CliRunner().invoke(_cli(), ["loadtest", "--url", url, "--data", str(_data(tmp_path)), "--policy",
                                          "single", "--concurrency", "1", "--requests", "3", "--deadline-ms", "1",
                                          "--out", str(tmp_path / "out")])
    assert res.exit_code == 1, res.output
    assert "http_504:deadline_exceeded" in res.output and "deadline exceeded" in res.output
    assert "no successful request" in res.output


def _rec(i: int, error: str | None = None, message: str | None = None, gold: str | None = "1") -> RequestRecord:
    return RequestRecord(policy="p", mode="closed", load=1, index=i, problem_id=str(i), gold=gold, start_s=0.0,
                         end_s=1.0, latency_s=0.5, ttfb_s=0.1 if error is None else None, error=error,
                         error_message=message, samples=None if error else 4, completion_tokens=None if error else 9,
                         correct=error is None)


def test_summary_of_failures_only_has_no_measures_and_a_warning() -> None:
    recs = [_rec(i, "timeout", "no complete answer within 2 s") for i in range(3)]
    s = summarize(recs, policy="p", mode="closed", load=1, elapsed_s=1.0)
    row = s.row()
    assert row["latency_p50_ms"] is None and row["accuracy"] is None and row["tokens_per_query"] is None
    assert row["throughput_rps"] == 0.0 and row["failed"] == 3
    assert s.error_examples == {"timeout": "no complete answer within 2 s"}
    assert level_warnings(s) == ["p · closed 1 clients: no successful request (3 of 3 failed): no latency or "
                                 "accuracy to report"]
    table = error_table([s])
    assert table is not None and table.row_count == 1
    assert error_table([summarize([_rec(0)], policy="p", mode="closed", load=1, elapsed_s=1.0)]) is None
    assert summary_table([s]).row_count == 1


def test_latency_is_over_successes_only_and_few_successes_are_warned() -> None:
    slow_failure = _rec(99, "http_500", "boom")
    slow_failure.latency_s = 9.0
    s = summarize([_rec(i) for i in range(MIN_OK_FOR_INTERVAL - 1)] + [slow_failure], policy="p", mode="closed",
                  load=1, elapsed_s=1.0)
    assert s.row()["latency_max_ms"] == pytest.approx(500, rel=1e-3)  # the failed request's 9 s is not in it
    assert s.scored_ok == MIN_OK_FOR_INTERVAL - 1
    [warning] = level_warnings(s)
    assert f"only {MIN_OK_FOR_INTERVAL - 1} successful scored request(s)" in warning
    enough = [_rec(i) for i in range(MIN_OK_FOR_INTERVAL)]
    assert level_warnings(summarize(enough, policy="p", mode="closed", load=1, elapsed_s=1.0)) == []
    ungraded = summarize([_rec(i, gold=None) for i in range(40)], policy="p", mode="closed", load=1, elapsed_s=1.0)
    assert ungraded.row()["accuracy"] is None and ungraded.row()["latency_p50_ms"] > 0  # no gold: no accuracy


def test_error_messages_are_read_from_the_envelope_or_the_body() -> None:
    envelope = json.dumps({"error": {"message": "deadline exceeded", "code": "deadline_exceeded"}}).encode()
    assert error_message(envelope) == "deadline exceeded"
    assert error_message(b"<html>502 Bad Gateway</html>\n") == "<html>502 Bad Gateway</html>"
    assert error_message(b"") == "(empty body)"
    assert len(clip("x" * 1000)) == 300 and clip("a\n  b") == "a b"


def test_transport_failures_carry_a_message() -> None:
    from app.backends.launcher import free_port

    spec = LevelSpec(url=f"http://127.0.0.1:{free_port()}", policy="x", mode="closed", load=1,
                     duration_s=None, max_requests=1, timeout_s=2)
    [rec] = asyncio.run(run_level(spec, [Problem("a", "q", "1")])).records
    assert rec.error == "connect_error" and rec.error_message and "ClientConnectorError" in rec.error_message


class KeyedService:
    """The fake service behind a key check: a request without ``Authorization: Bearer secret`` gets
    the service's 401 envelope."""

    def __init__(self) -> None:
        self.fake = FakeTTCService(latency_s=0.0, p_correct=1.0)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (b"authorization", b"Bearer secret") not in scope["headers"]:
            data = json.dumps({"error": {"message": "Missing API key", "type": "authentication_error",
                                         "code": "missing_api_key"}}).encode()
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": data})
            return
        await self.fake(scope, receive, send)


def test_the_api_key_is_sent_from_the_option_or_the_environment(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TTC_API_KEY", raising=False)
    with serve_in_thread(KeyedService()) as url:
        def run(*extra: str) -> Any:
            return CliRunner().invoke(_cli(), ["loadtest", "--url", url, "--data", str(_data(tmp_path)),
                                               "--policy", "single", "--concurrency", "1", "--requests", "2",
                                               "--out", str(tmp_path / "out"), *extra])
        without = run()
        assert without.exit_code == 1 and "http_401:missing_api_key" in without.output
        assert run("--api-key", "secret").exit_code == 0
        monkeypatch.setenv("TTC_API_KEY", "secret")
        from_env = run()
        assert from_env.exit_code == 0, from_env.output
        assert run("--api-key", "wrong").exit_code == 1  # the option wins over the environment


def test_a_policy_named_and_given_as_a_spec_runs_once_as_the_spec() -> None:
    """The label in --policies and --policy-spec once ran twice, the name half failing with 404s."""
    from ttc_tools.loadtest.cli import _policies

    spec = {"allocator": "fixed", "params": {"n": 2}}
    got = _policies("single,mine,default", [f"mine={json.dumps(spec)}", 'other={"allocator": "fixed"}'])
    assert got == [("single", "single"), ("mine", spec), ("default", "default"), ("other", {"allocator": "fixed"})]
    with pytest.raises(typer.BadParameter, match="given twice"):
        _policies("", ['a={"allocator": "fixed"}', 'a={"allocator": "uniform"}'])
    with pytest.raises(typer.BadParameter, match="LABEL=JSON"):
        _policies("", ['={"allocator": "fixed"}'])
