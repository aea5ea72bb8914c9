"""Traces cut inside the engine (the ``ttc_monitor`` vLLM plugin) as the service uses it: it checks at
start-up which backends cut traces, sends monitored calls only to them, and refuses a monitored policy
clearly where none can (the fake backend cuts the way vLLM with the plugin does, or not at all)."""

from __future__ import annotations

import logging

import pytest

from tests.api.test_stream_schedule import service
from ttc_tools.fakes.backend import MARKER, FakeOpenAI

DEEPCONF = {"allocator": "deepconf", "params": {"warmup": 2, "window": 4, "max_samples": 6},
            "schedule": {"mode": "stream"}}


def ask(policy: object, seed: int = 5, prompt: str = "What is 2 + 40?") -> dict[str, object]:
    return {"model": "fake-model", "seed": seed, "messages": [{"role": "user", "content": prompt}],
            "ttc": {"policy": policy}}


async def test_a_backend_that_does_not_cut_traces_gets_no_monitored_call_and_the_policy_is_refused(
        caplog: pytest.LogCaptureFixture) -> None:
    plain = FakeOpenAI(cuts=False, keep_bodies=True)
    with caplog.at_level(logging.WARNING, logger="ttc.backends"):
        async with service(plain) as c:
            assert plain.streams["cut_probes"] == 1  # asked once, at start-up
            resp = await c.post("/v1/chat/completions", json=ask(DEEPCONF))
            assert resp.status_code == 503, resp.text
            error = resp.json()["error"]
            assert error["code"] == "monitor_unavailable" and "ttc_monitor" in error["message"]
            assert "fake0: its engine did not cut the probe's trace" in error["message"]
            assert plain.calls == 0  # refused before anything was drawn
            ok = await c.post("/v1/chat/completions", json=ask("confident"))  # what needs no monitor still works
            assert ok.status_code == 200, ok.text
    assert any("cannot cut traces of fake-model" in r.getMessage() and "deepconf" in r.getMessage()
               for r in caplog.records)


async def test_monitored_calls_go_to_the_backends_that_cut() -> None:
    cutting, plain = FakeOpenAI(keep_bodies=True), FakeOpenAI(cuts=False, keep_bodies=True)
    async with service(cutting, plain) as c:
        for seed in range(3):  # samples that disagree: the warmup does not decide them
            resp = await c.post("/v1/chat/completions", json=ask(DEEPCONF, seed, "p_correct=0.4 What is 2 + 40?"))
            assert resp.status_code == 200, resp.text
        assert plain.calls == 0 and cutting.calls >= 3
        monitored = [b for b in cutting.bodies if "vllm_xargs" in b]
        assert monitored and all(b["vllm_xargs"]["ttc_monitor_marker"] == MARKER for b in monitored)
        for _ in range(4):  # plain calls are balanced over both
            assert (await c.post("/v1/chat/completions", json=ask("self-consistency-8"))).status_code == 200
        assert plain.calls > 0


@pytest.mark.parametrize(("params", "field"), [({"window": 0}, "window"), ({"top_k": 21}, "top_k"),
                                               ({"keep": 0}, "keep"), ({"fixed": -1}, "fixed"),
                                               ({"windw": 8}, "windw")])
async def test_a_bad_monitor_parameter_is_a_400_naming_it(params: dict[str, object], field: str) -> None:
    fake = FakeOpenAI()
    async with service(fake) as c:
        resp = await c.post("/v1/chat/completions", json=ask({**DEEPCONF, "params": params}))
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["param"] == f"ttc.policy.params.{field}"
        assert fake.calls == 0
