"""Traces cut inside the real vLLM CPU engine by the ``ttc_monitor`` plugin (installed into the engine's
venv by ``make``; every engine of the suite loads it): a call asking for the monitor has each child
of ``n=k`` cut on its own at the step the window arithmetic says, ending on the marker; the service's
``deepconf`` uses it, its traces sharing calls, billed as vLLM counted."""

from __future__ import annotations

from typing import Any

import httpx
from ttc_monitor.args import MonitorArgs
from ttc_monitor.window import GroupConfidence, first_cut, token_confidence

from tests.integration.conftest import MODEL_NAME, Stack, generated_since, generated_tokens
from tests.integration.test_vllm_service import HARD_QUESTION, chat_calls

MARKER = 3  # <unk> of the demo models' tokenizers


def vllm_chat(url: str, model: str = MODEL_NAME, **body: object) -> dict[str, object]:
    resp = httpx.post(url + "/v1/chat/completions", timeout=120, json={
        "model": model, "messages": [{"role": "user", "content": HARD_QUESTION}], "temperature": 1.0,
        "max_tokens": 120, **body})
    assert resp.status_code == 200, resp.text
    return resp.json()


def lowest(choice: dict[str, Any], window: int) -> float:
    group = GroupConfidence(window)
    for entry in choice["logprobs"]["content"]:
        c = token_confidence(a["logprob"] for a in entry["top_logprobs"])
        assert c is not None
        group.add(c)
    low = group.finish()
    assert low is not None
    return low


def test_the_engine_cuts_each_child_where_its_own_confidence_says(stack: Stack) -> None:
    """The same seeded n=8 call twice: plain, then with a threshold between its children's lowest group
    confidences (over the top-5 log-probs vLLM returned). Exactly the children below it are cut, each
    on the marker at the first window under the threshold (the same tokens up to there: the seed); the
    others are as they were."""
    window = 8
    body = {"n": 8, "seed": 4, "logprobs": True, "top_logprobs": 5}
    plain = vllm_chat(stack.vllm_a_url, **body)["choices"]  # type: ignore[index]
    lows = sorted(lowest(c, window) for c in plain)
    gap = max(range(1, 8), key=lambda i: lows[i] - lows[i - 1])  # cut the children under the widest gap
    threshold = (lows[gap - 1] + lows[gap]) / 2
    cut = vllm_chat(stack.vllm_a_url, **body, stop_token_ids=[MARKER],
                    vllm_xargs=MonitorArgs(threshold, MARKER, window, 5).as_xargs())["choices"]  # type: ignore[index]
    for before, after in zip(plain, cut, strict=True):
        entries = before["logprobs"]["content"]
        confidences = [token_confidence(a["logprob"] for a in e["top_logprobs"]) for e in entries]
        at = first_cut(confidences, window, threshold)  # type: ignore[arg-type]
        if at is None:
            assert after["stop_reason"] != MARKER and after["message"]["content"] == before["message"]["content"]
        else:  # the marker is the token at the cut: its step's confidence is in the window
            assert after["stop_reason"] == MARKER and len(after["logprobs"]["content"]) == at + 1
            assert [e["token"] for e in after["logprobs"]["content"][:at]] == [e["token"] for e in entries[:at]]
    assert sum(c["stop_reason"] == MARKER for c in cut) == gap


def test_a_call_without_monitor_arguments_is_untouched_and_bad_ones_are_refused(stack: Stack) -> None:
    data = vllm_chat(stack.vllm_b.url, n=4, seed=1, stop_token_ids=[MARKER])
    assert all(c["stop_reason"] != MARKER for c in data["choices"])  # type: ignore[attr-defined]
    resp = httpx.post(stack.vllm_b.url + "/v1/chat/completions", timeout=30, json={
        "model": MODEL_NAME, "messages": [{"role": "user", "content": HARD_QUESTION}],
        "vllm_xargs": {"ttc_monitor_threshold": 5, "ttc_monitor_marker": MARKER, "ttc_monitor_window": 0},
        "stop_token_ids": [MARKER]})
    assert resp.status_code == 400 and "ttc_monitor_window" in resp.text


def test_the_thinking_model_is_cut_inside_its_thought(stack: Stack) -> None:
    data = vllm_chat(stack.thinker_url, "arith-thinker", n=2, max_tokens=400, stop_token_ids=[MARKER],
                     vllm_xargs=MonitorArgs(1e9, MARKER, 16, 5).as_xargs())
    for choice in data["choices"]:  # type: ignore[attr-defined]
        assert choice["stop_reason"] == MARKER and not choice["message"]["content"]
    assert data["usage"]["completion_tokens"] == 2 * 16  # type: ignore[index]


def test_deepconf_cuts_traces_in_shared_calls_billed_as_vllm_counted(stack: Stack) -> None:
    """The service's deepconf (the threshold: the median of its four warmup traces' lowest confidences):
    later traces are cut by the engine inside n=k calls (fewer calls than traces), cut traces do not
    vote beside the warmup's whole ones, and the tokens
    billed are vLLM's (the cancelled streams' unseen tokens estimated: within a little of its counter)."""
    urls = (stack.vllm_a_url, stack.vllm_b.url)
    generated, calls = generated_tokens(*urls), chat_calls(stack)
    resp = httpx.post(stack.service_url + "/v1/chat/completions", timeout=120, json={
        "model": MODEL_NAME, "messages": [{"role": "user", "content": HARD_QUESTION}], "max_tokens": 120,
        "temperature": 1.0, "seed": 2,
        "ttc": {"policy": {"allocator": "deepconf", "params": {"warmup": 4, "keep": 50, "window": 8,
                                                                "max_samples": 16, "consensus": 1.0},
                           "schedule": {"mode": "stream"}}, "return_samples": True}})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    ttc = body["ttc"]
    cut = [s for s in ttc["samples"] if s["finish_reason"] == "cut"]
    assert ttc["samples_cut"] == len(cut) > 0 and all(s["truncated"] for s in cut)
    assert all(s["finish_reason"] != "cut" for s in ttc["samples"][:4])  # the warmup runs whole
    assert sum(ttc["votes"].values()) <= ttc["samples_drawn"] - len(cut)
    made = chat_calls(stack) - calls
    assert made < ttc["samples_drawn"] + ttc["samples_cancelled"], (made, ttc)
    billed = body["usage"]["completion_tokens"]
    counted = generated_since(generated, billed - 16, *urls)
    assert counted >= billed - 16, "vLLM counted fewer tokens than the service billed"
    assert counted - 16 * (ttc["samples_cancelled"] + 1) <= billed <= counted + 16 * ttc["samples_cancelled"]
