"""Step-level search against the real engines the embedded service starts: the demo generator
(``arith-llama``, engine A) writes one worked line per step, the bundled process reward model
(``arith-prm``, vLLM's pooling runner with ``step_tag_id`` 100) scores every step over HTTP, as a
Qwen2.5-Math-PRM served by vLLM would be. Checked: the ``prm`` verifier's score is the PRM's own
(min of its step scores, read back from ``/pooling``); beam search, DVTS and particle filtering
stop at the step delimiter, bill what vLLM generated and never overspend a token budget; a deadline
leaves nothing running in vLLM; a PRM that cannot be reached is a 502, not a silent vote. And search by
the generator's own token log-probs (the ``likelihood`` verifier) asks vLLM for them, not the PRM.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from app.backends.launcher import free_port
from tests.integration.conftest import MODEL_NAME, Stack, generated_since, generated_tokens, vllm_counter

QUESTION = "What is 463 - 87 - 25 + 39?"  # the demo model's samples disagree on this one
PRM = {"name": "prm", "params": {"url": "embedded:arith-prm", "model": "arith-prm", "step_delimiter": "\n",
                                 "format": "input"}}


def search(method: str, **spec: Any) -> dict[str, Any]:
    return {"allocator": "fixed", "aggregator": "best_of_n", "verifier": PRM,
            "search": {"method": method, "width": 4, "expand": 2, "step_delimiter": "\n", "step_tokens": 40,
                       **spec}}


def ask(stack: Stack, policy: dict[str, Any] | str, **ttc: Any) -> httpx.Response:
    return httpx.post(stack.embedded_url + "/v1/chat/completions", timeout=300, json={
        "model": MODEL_NAME, "messages": [{"role": "user", "content": QUESTION}], "temperature": 1.0, "seed": 7,
        "ttc": {"policy": policy, **ttc}})


def pooled(stack: Stack, text: str) -> list[float]:
    """The PRM's own step scores for one solution, asked directly."""
    steps = [s for s in text.split("\n") if s.strip()]
    body = httpx.post(stack.prm_url + "/pooling", timeout=60, json={
        "model": "arith-prm", "input": f"{QUESTION}\nA:\n" + "".join(s + "<extra_0>" for s in steps)}).json()
    return [pair[1] for pair in body["data"][0]["data"]]


def test_the_prm_verifier_scores_a_solution_by_its_weakest_step(stack: Stack) -> None:
    resp = ask(stack, {"allocator": "fixed", "params": {"n": 4}, "aggregator": "best_of_n", "verifier": PRM},
               return_samples=True)
    assert resp.status_code == 200, resp.text
    ttc = resp.json()["ttc"]
    for s in ttc["samples"]:
        assert s["score"] == pytest.approx(min(pooled(stack, s["text"])), abs=1e-4)
    best = max(ttc["samples"], key=lambda s: s["score"])
    assert ttc["selected_index"] == best["index"]


@pytest.mark.parametrize("method", ["beam", "dvts", "particles"])
def test_search_on_the_real_engines_bills_what_vllm_generated(stack: Stack, method: str) -> None:
    before = generated_tokens(stack.vllm_a_url)
    resp = ask(stack, search(method), return_samples=True)
    assert resp.status_code == 200, resp.text
    ttc, usage = resp.json()["ttc"], resp.json()["usage"]
    assert ttc["search"]["method"] == method and ttc["search"]["steps"] >= 3 and ttc["search"]["prm_calls"] >= 3
    assert 1 <= ttc["samples_drawn"] <= 4 and ttc["answer"] is not None
    for s in ttc["samples"]:
        lines = s["text"].split("\n")
        assert lines[-1].startswith("The answer is") and all(line for line in lines)  # one worked line a step
        assert 0.0 <= s["score"] <= 1.0
    billed = usage["completion_tokens"]
    assert generated_since(before, billed, stack.vllm_a_url) == billed


def test_search_by_the_generators_likelihood_asks_vllm_for_log_probs_not_the_prm(stack: Stack) -> None:
    """The likelihood verifier (min) scores the steps from the log-probs vLLM returns with each step (a
    continuation without them would be a 502: ``missing: error``); no PRM call; billed as vLLM counted."""
    before = generated_tokens(stack.vllm_a_url)
    spec = {**search("beam"), "verifier": {"name": "likelihood", "params": {"aggregate": "min"}}}
    resp = ask(stack, spec, return_samples=True)
    assert resp.status_code == 200, resp.text
    ttc, usage = resp.json()["ttc"], resp.json()["usage"]
    assert ttc["search"]["prm_calls"] == 0 and ttc["search"]["steps"] >= 3 and ttc["answer"] is not None
    for s in ttc["samples"]:
        assert s["text"].split("\n")[-1].startswith("The answer is")
        assert 0.0 < s["score"] < 1.0  # the probability of its least likely token
    billed = usage["completion_tokens"]
    assert generated_since(before, billed, stack.vllm_a_url) == billed
    named = ask(stack, "beam-likelihood")  # the built-in: the same search by name
    assert named.status_code == 200, named.text
    assert named.json()["ttc"]["policy"]["name"] == "beam-likelihood"
    assert named.json()["ttc"]["search"]["prm_calls"] == 0
    optimal = ask(stack, "compute-optimal-likelihood")  # two probe samples, then the table's choice
    assert optimal.status_code == 200, optimal.text
    rule = optimal.json()["ttc"]["search"]["optimal"]
    assert rule["choice"] == ["majority, width 2", "beam, width 2"][rule["bin"]], rule
    assert optimal.json()["ttc"]["search"].get("prm_calls", 0) == 0  # (a majority choice has no search tally)


def test_search_never_overspends_a_token_budget(stack: Stack) -> None:
    for budget in (100, 250):
        resp = ask(stack, search("beam", width=8), budget={"max_tokens": budget})
        assert resp.status_code == 200, resp.text
        assert resp.json()["usage"]["completion_tokens"] <= budget
        assert resp.json()["ttc"]["stop_reason"] == "tokens"


def test_a_deadline_stops_the_search_and_leaves_nothing_running(stack: Stack) -> None:
    resp = ask(stack, search("beam", width=16, expand=4), budget={"deadline_ms": 300})
    assert resp.status_code == 504, resp.text  # no solution finished within it: nothing to answer with
    assert resp.json()["error"]["code"] == "deadline_exceeded"
    deadline = time.monotonic() + 5
    while vllm_counter(stack.vllm_a_url, "vllm:num_requests_running") > 0:
        assert time.monotonic() < deadline, "a step call still runs in vLLM after the deadline"
        time.sleep(0.05)


def test_a_prm_that_cannot_be_reached_is_an_error_not_a_vote(stack: Stack) -> None:
    down = {**PRM, "params": {**PRM["params"], "url": f"http://127.0.0.1:{free_port()}"}}
    resp = ask(stack, {**search("beam"), "verifier": down})
    assert resp.status_code == 502, resp.text
    assert resp.json()["error"]["code"] == "verifier_failed"


def test_the_builtin_compute_optimal_policy_reads_the_difficulty_and_chooses(stack: Stack) -> None:
    resp = ask(stack, "compute-optimal", return_samples=True)
    assert resp.status_code == 200, resp.text
    ttc = resp.json()["ttc"]
    rule = ttc["search"]["optimal"]
    assert 0.0 <= rule["agreement"] <= 1.0 and rule["bin"] in (0, 1, 2, 3)
    expected = ["majority, width 4", "majority, width 8", "particles, width 8", "majority, width 16"][rule["bin"]]
    assert rule["choice"] == expected and ttc["samples_drawn"] >= 4  # the probe's samples stay among the answers
    assert all(s["score"] is not None for s in ttc["samples"])  # every sample scored by the PRM


@pytest.mark.parametrize("name", ["beam", "dvts", "particles"])
def test_the_builtin_search_policies_search_by_name(stack: Stack, name: str) -> None:
    listed = httpx.get(stack.embedded_url + f"/v1/policies/{name}", timeout=30)
    assert listed.status_code == 200, listed.text
    assert listed.json()["spec"]["search"]["method"] == name and listed.json()["spec"]["search"]["width"] == 8
    before = generated_tokens(stack.vllm_a_url)
    resp = ask(stack, name, return_samples=True)
    assert resp.status_code == 200, resp.text
    ttc, usage = resp.json()["ttc"], resp.json()["usage"]
    assert ttc["policy"]["name"] == name and ttc["search"]["method"] == name and ttc["search"]["prm_calls"] >= 3
    assert 1 <= ttc["samples_drawn"] <= 8 and all(s["score"] is not None for s in ttc["samples"])
    best = max(ttc["samples"], key=lambda s: s["score"])
    assert ttc["selected_index"] == best["index"]  # best-of-N by the PRM among the finished solutions
    billed = usage["completion_tokens"]
    assert generated_since(before, billed, stack.vllm_a_url) == billed
