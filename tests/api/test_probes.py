"""Probes of running thoughts (``probe`` in a policy, :mod:`app.probes`) against the fake backend in its
reasoning mode: a prompt with ``think=K`` makes each thought ``K`` tokens long, streamed one token per
chunk; a probe (the thought so far, closed, continued) answers the true answer in ``PROBE_TOKENS``
tokens and is counted by the fake.

A trace whose probes agree stops mid-thought and votes with the probed answer; a query whose allocator
is satisfied by its traces' provisional answers stops them all; probes are billed (usage, the ttc
block) and held in the token budget; a policy that cannot probe (rounds, completions) is a 400."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.api.test_stream_schedule import service
from ttc_tools.fakes.backend import PROBE_TOKENS, FakeOpenAI

THINK = 200


def policy(allocator: str, probe: dict[str, Any] | None, **params: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"allocator": allocator, "params": params, "schedule": {"mode": "stream", "width": 8,
                                                                                   "speculate": False}}
    if probe is not None:
        spec["probe"] = probe
    return spec


def chat(spec: Any, prompt: str = f"think={THINK} What is 2 + 40?", **ttc: Any) -> dict[str, Any]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": prompt}],
            "ttc": {"policy": spec, "return_samples": True, **ttc}}


def fake() -> FakeOpenAI:
    return FakeOpenAI(p_correct=1.0, reasoning_field="reasoning", token_latency_s=0.002)


async def test_a_trace_whose_probes_agree_stops_and_votes_with_the_probed_answer() -> None:
    backend = fake()
    async with service(backend) as c:
        resp = await c.post("/v1/chat/completions", json=chat(policy("fixed", {"every": 16, "agree": 2}, n=4)))
        body = resp.json()
    assert resp.status_code == 200, resp.text
    ttc, samples = body["ttc"], body["ttc"]["samples"]
    assert [s["finish_reason"] for s in samples] == ["probe"] * 4
    assert ttc["votes"] == {"40": 4} and ttc["samples_probed"] == 4
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["choices"][0]["message"]["content"] == "The answer is 40."
    assert all(32 <= s["tokens"] < THINK / 2 for s in samples), [s["tokens"] for s in samples]
    assert all(s["reasoning"].startswith("Let me think:") for s in samples)
    # every probe billed: the fake's count, the ttc block and usage agree
    stats = backend.streams
    assert ttc["probes"] == stats["probes"] >= 8 and ttc["probe_tokens"] == stats["probe_tokens"]
    assert body["usage"]["completion_tokens"] == sum(s["tokens"] for s in samples) + stats["probe_tokens"]
    # no trace thought to its end, so nothing measures what stopping saved: only the probes' cost shows
    assert ttc["tokens_saved"] == -stats["probe_tokens"]


async def test_without_probes_the_same_policy_thinks_to_the_end() -> None:
    async with service(fake()) as c:
        body = (await c.post("/v1/chat/completions", json=chat(policy("fixed", None, n=4)))).json()
    assert [s["finish_reason"] for s in body["ttc"]["samples"]] == ["stop"] * 4
    assert all(s["reasoning_tokens"] == THINK for s in body["ttc"]["samples"])
    assert body["ttc"]["probes"] == 0 and body["ttc"]["samples_probed"] == 0


async def test_an_adaptive_query_settles_on_its_traces_provisional_answers() -> None:
    """``agree: 8`` would never stop a trace on its own here; the allocator's stopping rule, fed each
    trace's provisional answer (its last seven probes agreeing), stops them all together."""
    backend = fake()
    async with service(backend) as c:
        spec = policy("adaptive_consistency", {"every": 8, "agree": 8}, max_samples=8)
        body = (await c.post("/v1/chat/completions", json=chat(spec))).json()
    ttc = body["ttc"]
    assert ttc["votes"] and set(ttc["votes"]) == {"40"}
    assert ttc["samples_probed"] >= 1
    probed = [s for s in ttc["samples"] if s["finish_reason"] == "probe"]
    assert all(s["tokens"] < THINK / 2 for s in probed)
    assert body["usage"]["completion_tokens"] < 8 * THINK / 2


async def test_probes_hold_their_tokens_in_the_budget() -> None:
    """Each trace holds its ``max_tokens`` (300) in the budget; a probe is made only when the rest can
    pay for it, so the budget is never overspent, however little is left for probes."""
    backend = fake()
    async with service(backend) as c:
        made = {}
        for budget in (1200, 1220, 1300, 2000):
            spec = policy("fixed", {"every": 8, "agree": 3}, n=4)
            body = chat(spec, budget={"max_tokens": budget})
            body["max_tokens"] = 300
            out = (await c.post("/v1/chat/completions", json=body)).json()
            assert out["usage"]["completion_tokens"] <= budget, (budget, out["usage"])
            assert out["ttc"]["probe_tokens"] == out["ttc"]["probes"] * PROBE_TOKENS
            made[budget] = out["ttc"]["probes"]
    assert made[1200] == 0 and made[2000] >= 8, made


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", chat({"allocator": "fixed", "params": {"n": 2}, "probe": {}}), "ttc.policy.schedule"),
    ("/v1/chat/completions", chat(policy("fixed", {}, n=2), schedule="rounds"), "ttc.schedule"),
    ("/v1/completions", {"model": "fake-model", "prompt": "What is 2 + 40?",
                         "ttc": {"policy": policy("fixed", {}, n=2)}}, "ttc.policy"),
    ("/v1/chat/completions", chat(policy("fixed", {"every": 2}, n=2)), "ttc.policy.probe.every"),
])
async def test_a_policy_that_cannot_probe_is_refused(path: str, body: dict[str, Any], param: str) -> None:
    async with service(fake()) as c:
        resp = await c.post(path, json=body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param


async def test_probes_leave_nothing_running(client: httpx.AsyncClient) -> None:
    """A probe policy on a backend without thoughts is plain sampling (nothing to probe)."""
    spec = policy("fixed", {"every": 8}, n=3)
    body = (await client.post("/v1/chat/completions", json=chat(spec, "What is 2 + 40?"))).json()
    assert body["ttc"]["probes"] == 0 and body["ttc"]["samples_drawn"] == 3
