"""Real outcomes from the bundled demo model through the service (vLLM CPU, real generations)."""

from __future__ import annotations

import concurrent.futures

import httpx

from tests.integration.conftest import MODEL_NAME, Stack
from ttc_tools.demo.problems import make_set


def ask(stack: Stack, question: str, policy: object, seed: int, max_samples: int = 16) -> dict:
    resp = httpx.post(stack.service_url + "/v1/chat/completions", timeout=300, json={
        "model": MODEL_NAME, "messages": [{"role": "user", "content": question}], "temperature": 0.8,
        "max_tokens": 160, "seed": seed, "ttc": {"policy": policy, "budget": {"max_samples": max_samples}}})
    assert resp.status_code == 200, resp.text
    return resp.json()["ttc"]


def test_majority_answer_is_correct_on_easy_problems(stack: Stack) -> None:
    easy = make_set(10, levels=[1], seed=11)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda p: ask(stack, p[1].question, "self-consistency-8", p[0]), enumerate(easy)))
    correct = [r["answer"] == str(p.gold) for r, p in zip(results, easy, strict=True)]
    assert sum(correct) >= 7, list(zip([p.question for p in easy], [r["votes"] for r in results], strict=True))


def test_adaptive_spends_more_on_hard_than_easy(stack: Stack) -> None:
    policy = {"allocator": "adaptive_consistency", "params": {"max_samples": 16}}
    easy = make_set(6, levels=[1], seed=21)
    hard = make_set(6, levels=[5], seed=21)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        easy_n = list(pool.map(lambda p: ask(stack, p[1].question, policy, p[0])["samples_drawn"], enumerate(easy)))
        hard_n = list(pool.map(lambda p: ask(stack, p[1].question, policy, p[0])["samples_drawn"], enumerate(hard)))
    assert sum(hard_n) / len(hard_n) > 1.5 * sum(easy_n) / len(easy_n), (easy_n, hard_n)


def test_batch_with_references_through_real_vllm(stack: Stack) -> None:
    problems = make_set(2, levels=[1, 2], seed=5)
    resp = httpx.post(stack.service_url + "/v1/ttc/batches", timeout=300, json={
        "model": MODEL_NAME, "messages": [[{"role": "user", "content": p.question}] for p in problems],
        "references": [str(p.gold) for p in problems], "budget": {"mean_samples": 4}, "temperature": 0.8,
        "max_tokens": 160, "seed": 3})
    assert resp.status_code == 200, resp.text
    data = resp.json()
    assert data["status"] == "completed"
    assert data["summary"]["samples_drawn"] <= 4 * len(problems)
    assert all(r["samples"] >= 1 for r in data["results"])
    assert data["summary"]["accuracy"] >= 0.5


def test_confident_policy_uses_real_logprobs_and_stops_early_on_easy(stack: Stack) -> None:
    """The built-in ``confident`` policy: likelihood scores come from vLLM's log-probs (the client did
    not ask for them), easy problems mostly settle on one sample, hard ones draw more."""
    easy = make_set(6, levels=[1], seed=31)
    hard = make_set(6, levels=[5], seed=31)

    def one(p: tuple[int, object]) -> dict:
        seed, problem = p
        resp = httpx.post(stack.service_url + "/v1/chat/completions", timeout=300, json={
            "model": MODEL_NAME, "messages": [{"role": "user", "content": problem.question}],  # type: ignore[attr-defined]
            "temperature": 1.0, "max_tokens": 160, "seed": seed,
            "ttc": {"policy": "confident", "return_samples": True}})
        assert resp.status_code == 200, resp.text
        return resp.json()["ttc"]

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        easy_r = list(pool.map(one, enumerate(easy)))
        hard_r = list(pool.map(one, enumerate(hard)))
    scores = [s["score"] for r in easy_r + hard_r for s in r["samples"]]
    assert all(0.0 < s <= 1.0 for s in scores), scores
    assert len(set(scores)) > 1
    easy_n = [r["samples_drawn"] for r in easy_r]
    hard_n = [r["samples_drawn"] for r in hard_r]
    assert max(easy_n + hard_n) <= 12
    assert sum(hard_n) > 1.5 * sum(easy_n), (easy_n, hard_n)
    assert sum(r["answer"] == str(p.gold) for r, p in zip(easy_r, easy, strict=True)) >= 4
