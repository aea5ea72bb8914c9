"""The service in front of real vLLM CPU servers, over real HTTP, including the openai client."""

from __future__ import annotations

import asyncio
import os
import time

import httpx
import openai
import pytest

from app.procs import children
from tests.integration.conftest import MODEL_NAME, Stack, generated_since, generated_tokens, vllm_counter
from tests.support.metrics import sample

QUESTION = "What is 512 + 37?"
HARD_QUESTION = "What is 463 - 87 - 25 + 39?"  # the demo model's answers vary on this one


def chat_calls(stack: Stack) -> float:
    """HTTP calls to vLLM's chat endpoint, both servers."""
    label = 'handler="/v1/chat/completions"'
    return sum(vllm_counter(u, "http_requests_total", label) for u in (stack.vllm_a_url, stack.vllm_b.url))


def chat_body(**ttc: object) -> dict[str, object]:
    return {"model": MODEL_NAME, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 48,
            "temperature": 0.8, "ttc": ttc}


def test_chat_completion_hits_vllm(stack: Stack) -> None:
    before = chat_calls(stack)
    resp = httpx.post(stack.service_url + "/v1/chat/completions", timeout=120, json=chat_body(
        policy={"allocator": "fixed", "params": {"n": 4}}, return_samples=True))
    assert resp.status_code == 200, resp.text
    data = resp.json()
    assert chat_calls(stack) - before == 1  # one vLLM request carried all four samples (n=4)
    assert data["ttc"]["samples_drawn"] == 4
    assert data["usage"]["completion_tokens"] == sum(s["tokens"] for s in data["ttc"]["samples"])
    assert data["usage"]["prompt_tokens"] > 0
    assert data["choices"][0]["message"]["content"] == data["ttc"]["samples"][data["ttc"]["selected_index"]]["text"]


def test_text_completion(stack: Stack) -> None:
    resp = httpx.post(stack.service_url + "/v1/completions", timeout=120, json={
        "model": MODEL_NAME, "prompt": QUESTION, "max_tokens": 32,
        "ttc": {"policy": "self-consistency-8"}})
    assert resp.status_code == 200, resp.text
    assert resp.json()["ttc"]["samples_drawn"] == 8
    assert resp.json()["usage"]["completion_tokens"] > 0


def test_multi_round_adaptive_stopping(stack: Stack) -> None:
    policy = {"allocator": "adaptive_consistency", "params": {"max_samples": 12, "per_round": 2, "lookahead": False}}
    data = httpx.post(stack.service_url + "/v1/chat/completions", timeout=180,
                      json=chat_body(policy=policy)).json()
    ttc = data["ttc"]
    assert ttc["rounds"] >= 2
    assert ttc["samples_drawn"] == 2 * ttc["rounds"]
    assert ttc["stop_reason"] in ("policy", "cap")


def test_seed_reproducibility(stack: Stack) -> None:
    body = {**chat_body(policy={"allocator": "fixed", "params": {"n": 4, "per_round": 2}}, return_samples=True),
            "seed": 77, "temperature": 1.0}
    body["messages"] = [{"role": "user", "content": HARD_QUESTION}]
    runs = [httpx.post(stack.service_url + "/v1/chat/completions", json=body, timeout=120).json()
            for _ in range(2)]
    texts = [[s["text"] for s in r["ttc"]["samples"]] for r in runs]
    assert texts[0] == texts[1]
    assert len(set(texts[0])) > 1  # different samples within a request


def test_openai_client_chat_stream_and_completions(stack: Stack) -> None:
    client = openai.OpenAI(base_url=stack.service_url + "/v1", api_key="unused", timeout=120)
    chat = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": QUESTION}], max_tokens=40,
        extra_body={"ttc": {"policy": "esc", "budget": {"max_samples": 10}}},
    )
    assert chat.choices[0].message.content is not None
    ttc = chat.model_extra["ttc"]  # type: ignore[index]
    assert ttc["policy"]["name"] == "esc" and 1 <= ttc["samples_drawn"] <= 10

    stream = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": QUESTION}], max_tokens=40, stream=True,
        extra_body={"ttc": {"policy": {"allocator": "fixed", "params": {"n": 4, "per_round": 2}},
                            "return_samples": True}},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    progress = [(c.model_extra or {}).get("ttc", {}) for c in chunks]
    rounds = [p["round"] for p in progress if "round" in p]
    assert rounds == [1, 2]
    assert chunks[-1].choices[0].finish_reason is not None
    final = (chunks[-1].model_extra or {})["ttc"]
    assert text == final["samples"][final["selected_index"]]["text"]

    # one sample: vLLM's tokens reach the client as they come, chunk by chunk (time to first token)
    single = list(client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": QUESTION}], max_tokens=40, stream=True,
        extra_body={"ttc": {"policy": "single", "return_samples": True}}))
    pieces = [c.choices[0].delta.content for c in single if c.choices and c.choices[0].delta.content]
    final = (single[-1].model_extra or {})["ttc"]
    assert len(pieces) > 1 and "".join(pieces) == final["samples"][0]["text"]

    comp = client.completions.create(model=MODEL_NAME, prompt=QUESTION, max_tokens=20,
                                     extra_body={"ttc": {"policy": "single"}})
    assert comp.model_extra["ttc"]["samples_drawn"] == 1  # type: ignore[index]

    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "x"}], n=2)
    assert info.value.body["param"] == "n"  # type: ignore[index]


def test_metrics_after_traffic(stack: Stack) -> None:
    text = httpx.get(stack.service_url + "/metrics", timeout=10).text
    ok = sample(text, "ttc_requests_total", outcome="ok")
    assert ok >= 1
    assert sample(text, "ttc_samples_drawn_total") >= ok  # every answered request drew a sample
    assert sample(text, "ttc_backend_latency_seconds_count") >= 1


def test_client_disconnect_cancels_backend_work(stack: Stack) -> None:
    """A client that goes away stops the run: the in-flight vLLM call is aborted (vLLM's generation
    counter stops rising, nothing is left running) and no further rounds are drawn (without
    cancellation all 64 samples of 200 tokens would be generated)."""
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 200,
            "temperature": 1.0, "ignore_eos": True,
            "ttc": {"policy": {"allocator": "fixed", "params": {"n": 64, "per_round": 8}}}}
    urls = (stack.vllm_a_url, stack.vllm_b.url)

    async def total(name: str) -> float:
        # read off the loop: a blocking read would also hold up the request being watched
        return sum([await asyncio.to_thread(vllm_counter, u, name) for u in urls])

    async def go() -> None:
        tokens_before = await total("vllm:generation_tokens_total")
        async with httpx.AsyncClient(timeout=60) as c:
            task = asyncio.create_task(c.post(stack.service_url + "/v1/chat/completions", json=body))
            deadline = time.monotonic() + 30
            # a counter cannot be missed the way a sampled gauge can: generation has begun
            while await total("vllm:generation_tokens_total") <= tokens_before:
                assert time.monotonic() < deadline and not task.done(), "the request never reached vLLM"
                await asyncio.sleep(0.05)
            task.cancel()
        deadline = time.monotonic() + 2
        while await total("vllm:num_requests_running") > 0:
            assert time.monotonic() < deadline, "vLLM still generating 2 s after the client disconnected"
            await asyncio.sleep(0.1)
        stopped_at = await total("vllm:generation_tokens_total")
        await asyncio.sleep(2)  # were it not cancelled, the run would go on with more rounds
        assert await total("vllm:num_requests_running") == 0
        assert await total("vllm:generation_tokens_total") == stopped_at
        assert stopped_at - tokens_before < 64 * 200

    asyncio.run(go())


def test_embedded_default_answers_with_ttc_block(stack: Stack) -> None:
    """The `make serve` path: a service started with no backend runs its own vLLM engines: the default
    model (first, the one a request without a model gets) and the bundled thinking model (the PRM is a
    pooling endpoint, not a model to generate with)."""
    models = httpx.get(stack.embedded_url + "/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == [MODEL_NAME, "arith-thinker"]
    resp = httpx.post(stack.embedded_url + "/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 48,
        "ttc": {"policy": "adaptive", "budget": {"max_samples": 8}}})
    assert resp.status_code == 200, resp.text
    ttc = resp.json()["ttc"]
    assert ttc["policy"]["name"] == "adaptive" and 1 <= ttc["samples_drawn"] <= 8


def test_stream_schedule_deadline_aborts_every_vllm_request(stack: Stack) -> None:
    """Stream schedule on real vLLM: 60 streamed samples of 230 tokens cannot finish by the deadline; at the
    deadline the service closes the stream, and vLLM aborts them: nothing left running, its
    generation counter stops short of the 13,800 tokens asked for (with ``ignore_eos`` every sample
    not aborted runs to exactly 230 tokens, so falling short means samples were aborted; how far
    short depends on the engine's speed, printed)."""
    urls = (stack.vllm_a_url, stack.vllm_b.url)

    def total(name: str) -> float:
        return sum(vllm_counter(u, name) for u in urls)

    def ask(max_tokens: int, budget: dict[str, int]) -> httpx.Response:
        return httpx.post(stack.service_url + "/v1/chat/completions", timeout=60, json={
            "model": MODEL_NAME, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": max_tokens,
            "temperature": 1.0, "ignore_eos": True,
            "ttc": {"policy": {"allocator": "fixed", "params": {"n": 60}},
                    "schedule": {"mode": "stream", "width": 60}, "budget": budget}})

    # The same shape once without a deadline first: on a fresh engine the first long batch of 60 can
    # take longer than the deadline to start decoding, and then nothing at all would be generated.
    started = time.monotonic()
    assert ask(64, {}).status_code == 200
    rate = 60 * 64 / (time.monotonic() - started)
    # A deadline a third of the time the whole job takes at that rate (at most 0.4 s): on a fast engine
    # a fixed 0.4 s could let every sample finish before the abort reaches it.
    deadline_ms = int(max(100, min(400, 1000 * 60 * 230 / rate / 3)))
    before, calls_before = total("vllm:generation_tokens_total"), chat_calls(stack)
    resp = ask(230, {"deadline_ms": deadline_ms})
    assert resp.status_code == 504, resp.text
    assert resp.json()["error"]["param"] == "ttc.budget.deadline_ms"
    deadline = time.monotonic() + 3
    while total("vllm:num_requests_running") > 0:
        assert time.monotonic() < deadline, "vLLM still generating 3 s after the deadline"
        time.sleep(0.1)
    stopped_at = total("vllm:generation_tokens_total")
    time.sleep(1.5)  # vLLM publishes its counters about once a second: a still-running request would show
    assert total("vllm:generation_tokens_total") == stopped_at
    print(f"generated before the deadline stopped them: {stopped_at - before:.0f} of {60 * 230} tokens "
          f"(deadline {deadline_ms} ms; the engine's rate on this shape: {rate:.0f} tokens/s)")
    assert chat_calls(stack) - calls_before == 1  # the streamed call reached vLLM (and ended there)
    assert stopped_at - before < 0.9 * 60 * 230


def test_stream_schedule_on_vllm_answers_and_rides_the_prefix_cache(stack: Stack) -> None:
    """Each streamed sample is its own vLLM request with the same prompt: with a prompt of several
    KV blocks (vLLM CPU caches whole blocks of 128 tokens), samples started after the first ones
    finished hit vLLM's prefix cache; the answer, votes and usage add up."""
    urls = (stack.vllm_a_url, stack.vllm_b.url)
    hits_before = sum(vllm_counter(u, "vllm:prefix_cache_hits_total") for u in urls)
    prompt = " ".join(["What is 12 + 5?"] * 8) + " " + QUESTION  # 146 tokens (the demo template drops system)
    resp = httpx.post(stack.service_url + "/v1/chat/completions", timeout=120, json={
        "model": MODEL_NAME, "max_tokens": 48, "temperature": 0.8,
        "messages": [{"role": "user", "content": prompt}],
        "ttc": {"policy": {"allocator": "fixed", "params": {"n": 6}}, "schedule": {"mode": "stream", "width": 2},
                "return_samples": True}})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    ttc = body["ttc"]
    assert ttc["schedule"] == "stream" and ttc["samples_drawn"] == 6 and ttc["samples_cancelled"] == 0
    assert 1 <= sum(ttc["votes"].values()) <= 6
    assert body["usage"]["completion_tokens"] == sum(s["tokens"] for s in ttc["samples"])
    assert sum(vllm_counter(u, "vllm:prefix_cache_hits_total") for u in urls) > hits_before


def test_deepconf_on_vllm_reads_streamed_top_k_logprobs(stack: Stack) -> None:
    """The built-in deepconf policy on real vLLM: every trace is its own streamed call with top-5
    log-probs, every sample gets a confidence, and the accounting adds up (cut or not)."""
    resp = httpx.post(stack.service_url + "/v1/chat/completions", timeout=120, json={
        "model": MODEL_NAME, "messages": [{"role": "user", "content": HARD_QUESTION}], "max_tokens": 160,
        "temperature": 1.0, "ttc": {"policy": "deepconf", "budget": {"max_samples": 12}, "return_samples": True}})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    ttc = body["ttc"]
    assert ttc["schedule"] == "stream" and 1 <= ttc["samples_drawn"] <= 12, ttc
    assert all(isinstance(s["confidence"], float) and s["confidence"] > 0 for s in ttc["samples"])
    assert ttc["samples_cut"] == sum(s["finish_reason"] == "cut" for s in ttc["samples"])
    assert body["usage"]["completion_tokens"] == sum(s["tokens"] for s in ttc["samples"]) + ttc["tokens_cancelled"]


@pytest.mark.parametrize("policy", ["default", "adaptive", "confident", "deepconf", "self-consistency-8"])
def test_usage_counts_what_vllm_counted(stack: Stack, policy: str) -> None:
    """The prompt tokens a client is billed are those of every call the request made to vLLM, as vLLM's
    own usage counts a call (its prompt once, whatever its n: the OpenAI convention), streamed calls
    cancelled once the query was decided included. Checked with vLLM's own counters: the calls it
    received (``http_requests_total``), one call's prompt (its usage), the tokens it generated."""
    urls = (stack.vllm_a_url, stack.vllm_b.url)
    messages = [{"role": "user", "content": "Start with 746, subtract 62, subtract 80, add 16. What is the result?"}]
    one = httpx.post(stack.vllm_a_url + "/v1/chat/completions", timeout=60,
                     json={"model": MODEL_NAME, "messages": messages, "max_tokens": 1}).json()["usage"]["prompt_tokens"]
    calls, generated = chat_calls(stack), generated_tokens(*urls)
    resp = httpx.post(stack.service_url + "/v1/chat/completions", timeout=120, json={
        "model": MODEL_NAME, "temperature": 1.0, "seed": 3, "ttc": {"policy": policy}, "messages": messages})
    assert resp.status_code == 200, resp.text
    usage, ttc = resp.json()["usage"], resp.json()["ttc"]
    made = chat_calls(stack) - calls
    assert usage["prompt_tokens"] == one * made > 0, (usage, one, made)
    counted = generated_since(generated, usage["completion_tokens"], *urls)
    stopped = ttc["samples_cancelled"] + ttc["samples_cut"]  # streams closed early: what vLLM had in flight is unseen
    assert counted - 48 * stopped <= usage["completion_tokens"] <= counted, (usage, counted, stopped)
    if not stopped:
        assert usage["completion_tokens"] == counted


def test_the_engine_core_runs_on_its_workers_cores_and_the_api_server_keeps_the_rest(stack: Stack) -> None:
    """vLLM binds its CPU worker to some cores; once up, the launcher moves the engine core there
    (app.backends.launcher.pin_engine_core) and leaves the API server where it was."""
    server = stack.vllm_b.proc
    assert server is not None
    engine_procs = children(server.pid)
    workers = [w for p in engine_procs for w in children(p)]
    assert engine_procs and workers
    bound = set().union(*(os.sched_getaffinity(w) for w in workers))
    free = os.sched_getaffinity(server.pid)
    if not bound < free:  # a 1-core machine: the worker has every core, nothing moved
        assert stack.vllm_b.pinned is None
        return
    assert stack.vllm_b.pinned == bound
    for pid in engine_procs:
        assert {frozenset(os.sched_getaffinity(int(t))) for t in os.listdir(f"/proc/{pid}/task")} == {frozenset(bound)}
    assert os.sched_getaffinity(server.pid) == free
