"""Recorded traffic: served samples are stored per policy, exported as replay JSONL, and replayed."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from app.admin_cli import parse_time
from app.backends.replay import load_problems
from app.recording import export_jsonl
from tests.conftest import fake_settings, service_client
from tests.support.cli import ttc_app
from ttc_tools.fakes.backend import FakeOpenAI


def chat(content: str, **ttc: Any) -> dict[str, Any]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": content}], "ttc": ttc}


def cli() -> Any:
    return ttc_app()


async def test_record_export_replay_round_trip(tmp_path: Path, fake: FakeOpenAI) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'ttc.db'}"
    settings = fake_settings(["fake-a"], store={"url": url})
    async with service_client(settings, {"fake-a": fake}) as api:
        r = await api.post("/v1/policies", json={"name": "rec", "allocator": "fixed", "params": {"n": 6},
                                                 "record": True})
        assert r.status_code == 201 and r.json()["spec"]["record"] is True
        for i in range(3):
            r = await api.post("/v1/chat/completions", json=chat(f"What is {i} + 40?", policy="rec",
                                                                 reference=str(i + 40)))
            assert r.status_code == 200
        await api.post("/v1/chat/completions", json=chat("What is 5 + 5?", policy="rec"))  # no reference
        await api.post("/v1/chat/completions", json=chat("What is 1 + 1?", policy="single"))  # not recorded
        state = api.app.state.ttc  # type: ignore[attr-defined]
        await state.recorder.flush()
        rows = await state.store.recordings()
    assert len(rows) == 4 and {r["policy_name"] for r in rows} == {"rec"}
    assert all(len(r["answers"]) == 6 and len(r["tokens"]) == 6 and r["latency_ms"] > 0 for r in rows)

    out = tmp_path / "traffic.jsonl"
    runner = CliRunner()
    res = await asyncio.to_thread(runner.invoke, cli(), ["export", "--store-url", url, "--since", "1h",
                                                         "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "wrote 4 problem(s)" in res.output
    problems = load_problems(out)  # the replay loader accepts it
    assert len(problems) == 4
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    with_ref = [x for x in lines if x["gold"] is not None]
    assert len(with_ref) == 3
    for x in with_ref:
        assert x["correct"] == [a == x["gold"] for a in x["answers"]]
        assert x["meta"]["policy"] == "rec" and x["meta"]["policy_version"] == 1 and "correct_unknown" not in x["meta"]
        assert len(x["tokens"]) == 6 and x["question"].startswith("What is")
    assert any(c for x in with_ref for c in x["correct"])
    unknown = next(x for x in lines if x["gold"] is None)
    assert unknown["correct"] == [False] * 6 and unknown["meta"]["correct_unknown"] is True

    res = await asyncio.to_thread(runner.invoke, cli(), ["export", "--store-url", url, "--until", "2000-01-01",
                                                         "--out", str(tmp_path / "none.jsonl")])
    assert "wrote 0 problem(s)" in res.output

    pytest.importorskip("app.replay.cli")
    report = tmp_path / "report.json"
    res = await asyncio.to_thread(runner.invoke, cli(), [
        "replay", "--data", str(out), "--policy", "uniform", "--budgets", "1,4", "--seeds", "2",
        "--resamples", "10", "--json", str(report)])
    assert res.exit_code == 0, res.output
    assert report.exists()


async def test_global_recording_switch(fake: FakeOpenAI) -> None:
    settings = fake_settings(["fake-a"], recording={"enabled": True})
    async with service_client(settings, {"fake-a": fake}) as api:
        await api.post("/v1/policies", json={"name": "off", "allocator": "fixed", "record": False})
        await api.post("/v1/chat/completions", json=chat("What is 2 + 2?", policy="single"))
        await api.post("/v1/chat/completions", json=chat("What is 2 + 2?", policy="off"))
        await api.post("/v1/chat/completions", json=chat("What is 3 + 3?", policy="single"))
        state = api.app.state.ttc  # type: ignore[attr-defined]
        await state.recorder.flush()
        assert await state.store.count_recordings() == 2


def test_parse_time() -> None:
    assert parse_time("2h", now=10_000.0) == 10_000.0 - 7200
    assert parse_time("1970-01-02") == 86400.0
    assert parse_time("1700000000") == 1_700_000_000.0


async def test_top_logprobs_are_recorded_as_traces_that_deepconf_replays(tmp_path: Path, fake: FakeOpenAI) -> None:
    from app.confidence import decode_trace
    from app.replay.evaluator import evaluate, resolve_policy
    from ttc_tools.fakes.backend import _alternatives

    settings = fake_settings(["fake-a"], recording={"enabled": True})
    async with service_client(settings, {"fake-a": fake}) as api:
        fixed = {"allocator": "fixed", "params": {"n": 6}}
        for i in range(4):
            body = chat(f"What is {i} + 40?", policy=fixed, reference=str(i + 40))
            r = await api.post("/v1/chat/completions", json={**body, "logprobs": True, "top_logprobs": 5})
            assert r.status_code == 200, r.text
        r = await api.post("/v1/chat/completions", json={**chat("What is 9 + 9?", policy=fixed), "logprobs": True})
        assert r.status_code == 200, r.text
        state = api.app.state.ttc  # type: ignore[attr-defined]
        await state.recorder.flush()
        out = tmp_path / "traces.jsonl"
        assert await export_jsonl(state.store, out) == 5
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    traced = [x for x in lines if "traces" in x]
    assert len(traced) == 4 and all(x["meta"]["trace_top_k"] == 5 for x in traced)
    assert "traces" not in next(x for x in lines if x["gold"] is None)  # log-probs without alternatives
    for x in traced:
        for trace, tokens, lp in zip(x["traces"], x["tokens"], x["logprobs"], strict=True):
            values = decode_trace(trace)
            expected = -sum(_alternatives(lp, 5)) / 5  # the fake's tokens all have the sample's log-prob
            assert len(values) == tokens and values == pytest.approx([expected] * tokens, abs=0.05)
    policy = resolve_policy("deepconf", {"max_samples": 6, "warmup": 4}, schedule="stream")
    report = await asyncio.to_thread(evaluate, [p for p in load_problems(out) if p.traces], policy, [6], 2,
                                     resamples=10)
    assert report.rows[0].mean_samples >= 4  # the warmup ran on the recorded traces
