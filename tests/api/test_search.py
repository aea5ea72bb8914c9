"""Step-level search through the service, on a known tree of steps where most samples go wrong and the
process reward model knows which first step is right: a majority vote over whole samples picks the
wrong answer; beam search, DVTS and particle filtering, pruning by the PRM, find the right one. Budgets
hold, the step delimiter is what generation stops at, and a PRM that is down is an error (never a
silent vote)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tests.conftest import fake_settings, service_client
from ttc_tools.fakes.tree import FakePRM, FakeTree

TREE = {
    "": [("I add first", 0.75), ("I subtract first", 0.25)],
    "I add first\n": [("so 39 - 26 = 13", 1.0)],
    "I subtract first\n": [("so 2 + 40 = 42", 1.0)],
    "I add first\nso 39 - 26 = 13\n": [("The answer is 13.", 1.0)],
    "I subtract first\nso 2 + 40 = 42\n": [("The answer is 42.", 1.0)],
}
PRM = {"I add first": 0.1, "so 39 - 26 = 13": 0.2, "I subtract first": 0.9, "so 2 + 40 = 42": 0.95,
       "The answer is 42.": 0.97, "The answer is 13.": 0.1}


def policy(method: str | None, **search: Any) -> dict[str, Any]:
    prm = {"name": "prm", "params": {"url": "http://prm:8000", "model": "prm", "step_delimiter": "\n"}}
    if method is None:
        return {"allocator": "fixed", "params": {"n": 8}, "aggregator": "majority"}
    return {"allocator": "fixed", "aggregator": "best_of_n", "verifier": prm,
            "search": {"method": method, "width": 8, "expand": 4, "step_delimiter": "\n", "step_tokens": 32,
                       **search}}


def ask(spec: dict[str, Any] | str, **ttc: Any) -> dict[str, Any]:
    return {"model": "fake-model", "seed": 5, "messages": [{"role": "user", "content": "What is 2 + 40?"}],
            "ttc": {"policy": spec, **ttc}}


async def post(tree: FakeTree, prm: FakePRM, body: dict[str, Any]) -> Any:
    async with service_client(fake_settings(["gen"]), {"gen": tree, "prm": prm}) as c:
        return await c.post("/v1/chat/completions", json=body)


async def test_a_majority_vote_goes_the_wrong_way_on_this_tree() -> None:
    resp = await post(FakeTree(TREE), FakePRM(PRM), ask(policy(None)))
    assert resp.status_code == 200, resp.text
    assert resp.json()["ttc"]["answer"] == "13"


@pytest.mark.parametrize("method", ["beam", "dvts", "particles"])
async def test_search_with_the_prm_finds_the_right_branch(method: str) -> None:
    tree, prm = FakeTree(TREE), FakePRM(PRM)
    resp = await post(tree, prm, ask(policy(method), return_samples=True))
    assert resp.status_code == 200, resp.text
    ttc = resp.json()["ttc"]
    assert ttc["answer"] == "42", ttc
    assert ttc["search"]["method"] == method and ttc["search"]["steps"] >= 3 and ttc["search"]["prm_calls"] >= 3
    assert all(s["text"].count("\n") == 2 for s in ttc["samples"])  # three steps, joined by the delimiter
    assert all(b.get("stop") == ["\n"] for b in tree.bodies)  # every call stops at the step delimiter
    continued = [b for b in tree.bodies if b.get("continue_final_message")]
    assert continued and all(b["add_generation_prompt"] is False and b["messages"][-1]["role"] == "assistant"
                             for b in continued)
    assert resp.json()["usage"]["completion_tokens"] == tree.completion_tokens  # every step generated is billed


@pytest.mark.parametrize(("aggregate", "expected"), [("min", 0.9), ("last", 0.97), ("prod", 0.9 * 0.95 * 0.97)])
async def test_a_finished_solution_scores_as_the_prm_aggregates_its_steps(aggregate: str, expected: float) -> None:
    """Search keeps partial solutions by their last step's score, but a solution it finishes joins the
    query with the verifier's ``aggregate`` of its steps (as a whole sample scored by the PRM would)."""
    spec = policy("beam")
    spec["verifier"]["params"]["aggregate"] = aggregate
    resp = await post(FakeTree(TREE), FakePRM(PRM), ask(spec, return_samples=True))
    assert resp.status_code == 200, resp.text
    right = [s for s in resp.json()["ttc"]["samples"] if s["answer"] == "42"]
    assert right and all(s["score"] == pytest.approx(expected) for s in right), right


async def test_search_never_overspends_its_token_budget() -> None:
    tree = FakeTree(TREE)
    for budget in (40, 100, 300):
        resp = await post(tree, FakePRM(PRM), ask(policy("beam"), budget={"max_tokens": budget}))
        if resp.status_code == 400:  # a budget that buys no step at all
            assert resp.json()["error"]["code"] == "budget_too_small"
            continue
        assert resp.status_code == 200, resp.text
        assert resp.json()["usage"]["completion_tokens"] <= budget
        assert resp.json()["ttc"]["stop_reason"] in ("tokens", "policy")


async def test_a_budget_that_narrows_the_search_says_tokens() -> None:
    """Width 8 asks 8 continuations of the first step; 100 tokens pay for 3 of 32: the search runs
    narrower than asked, and when its beams run out that is the budget's doing."""
    resp = await post(FakeTree(TREE), FakePRM(PRM), ask(policy("beam"), budget={"max_tokens": 100}))
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["completion_tokens"] <= 100 and resp.json()["ttc"]["stop_reason"] == "tokens"


async def test_a_deadline_in_the_middle_of_a_step_ends_the_search() -> None:
    """The deadline passes while a step's calls run (each takes 0.2 s; a solution needs three steps):
    they are cut and the search stops; no solution finished, so even partial_on_deadline has nothing to
    return: a 504 saying so (it was a 500)."""
    for partial in (True, False):
        resp = await post(FakeTree(TREE, latency_s=0.2), FakePRM(PRM),
                          ask(policy("beam"), budget={"deadline_ms": 500}, partial_on_deadline=partial))
        assert resp.status_code == 504, resp.text
        assert resp.json()["error"]["code"] == "deadline_exceeded"


async def test_a_prm_that_is_down_is_an_error_not_a_vote() -> None:
    resp = await post(FakeTree(TREE), FakePRM(PRM, healthy=False), ask(policy("beam")))
    assert resp.status_code == 502, resp.text
    assert resp.json()["error"]["code"] == "verifier_failed"


async def test_beam_search_keeps_distinct_partial_solutions_before_copies() -> None:
    """Both first steps look good to this PRM, the likely one a little better: six of the eight first
    continuations are copies of it, and a beam of two kept by score alone would hold two copies and lose
    the other branch, whose next step is the one the PRM likes (the only way to 42)."""
    prm = FakePRM({**PRM, "I add first": 0.9, "I subtract first": 0.8})
    resp = await post(FakeTree(TREE), prm, ask(policy("beam"), return_samples=True))
    assert resp.status_code == 200, resp.text
    ttc = resp.json()["ttc"]
    assert ttc["answer"] == "42", ttc
    assert {s["text"].split("\n")[0] for s in ttc["samples"]} == {"I add first", "I subtract first"}


LIKELIHOOD = {"name": "likelihood", "params": {"aggregate": "min"}}
SLIP = {"I add first": -6.0}
"""The likely first step holds a token the generator found unlikely (its slip); every other token of the
tree is likely (log-prob -0.1 or above)."""


@pytest.mark.parametrize("method", ["beam", "dvts", "particles"])
async def test_search_by_the_generators_own_likelihood_needs_no_prm(method: str) -> None:
    """The likelihood verifier scores each step from its own tokens' log-probs (min: a partial solution's
    least likely token): the branch through the slip loses, with no PRM call at all."""
    tree, prm = FakeTree(TREE, surprise=SLIP), FakePRM(PRM)
    resp = await post(tree, prm, ask({**policy(method), "verifier": LIKELIHOOD}, return_samples=True))
    assert resp.status_code == 200, resp.text
    ttc = resp.json()["ttc"]
    assert ttc["answer"] == "42", ttc
    assert ttc["search"]["prm_calls"] == 0 and prm.calls == 0
    assert all(b.get("logprobs") for b in tree.bodies)  # every continuation asked for its tokens' log-probs
    best = max(ttc["samples"], key=lambda s: s["score"])
    assert best["answer"] == "42" and best["score"] == pytest.approx(math.exp(-0.1))  # its least likely token
    assert resp.json()["usage"]["completion_tokens"] == tree.completion_tokens


async def test_without_the_slip_the_likely_branch_wins_the_likelihood_search() -> None:
    """The same search on the same tree without the slip: nothing marks the likely branch as wrong, so it
    wins (the search follows the generator's own confidence, nothing else)."""
    resp = await post(FakeTree(TREE), FakePRM(PRM), ask({**policy("beam"), "verifier": LIKELIHOOD}))
    assert resp.status_code == 200, resp.text
    assert resp.json()["ttc"]["answer"] == "13"


async def test_compute_optimal_by_the_generators_likelihood_needs_no_prm() -> None:
    """The probe disagrees (bin 1: beam search), and the search by likelihood avoids the slip: 42 with no
    PRM call; the probe's samples are scored by their least likely token too."""
    table = [{"method": "majority", "width": 8}, {"method": "beam", "width": 8}]
    tree, prm = FakeTree(TREE, surprise=SLIP), FakePRM(PRM)
    resp = await post(tree, prm, ask({**optimal(table, [0.99]), "verifier": LIKELIHOOD}, return_samples=True))
    assert resp.status_code == 200, resp.text
    ttc = resp.json()["ttc"]
    assert ttc["search"]["optimal"]["choice"] == "beam, width 8" and ttc["answer"] == "42", ttc
    assert prm.calls == 0 and all(b.get("logprobs") for b in tree.bodies)
    assert all(s["score"] is not None for s in ttc["samples"])
    assert resp.json()["usage"]["completion_tokens"] == tree.completion_tokens


async def test_the_builtin_compute_optimal_by_likelihood_probes_two_and_chooses_by_name() -> None:
    """The built-in: two probe samples, then its table's choice (their answer, or a beam of 2 where they
    disagree), every call with log-probs, no PRM call, everything generated billed."""
    tree, prm = FakeTree(TREE, surprise=SLIP), FakePRM(PRM)
    resp = await post(tree, prm, ask("compute-optimal-likelihood", return_samples=True))
    assert resp.status_code == 200, resp.text
    ttc = resp.json()["ttc"]
    rule = ttc["search"]["optimal"]
    assert rule["choice"] == ["majority, width 2", "beam, width 2"][rule["bin"]], rule
    assert ttc["policy"]["name"] == "compute-optimal-likelihood" and ttc["samples_drawn"] >= 2
    assert prm.calls == 0 and all(b.get("logprobs") for b in tree.bodies)
    assert resp.json()["usage"]["completion_tokens"] == tree.completion_tokens


def optimal(table: list[dict[str, Any]], bins: list[float]) -> dict[str, Any]:
    spec = policy("beam")
    return {**spec, "aggregator": "weighted_majority", "optimal": {"probe": 4, "bins": bins, "table": table}}


async def test_compute_optimal_searches_where_the_probe_disagrees() -> None:
    """The probe's samples disagree on this tree (3 of 4 say 13): bin 1, where the table says beam search,
    which finds 42; the rule's reading is in the ttc block."""
    table = [{"method": "majority", "width": 8}, {"method": "beam", "width": 8}]
    resp = await post(FakeTree(TREE), FakePRM(PRM), ask(optimal(table, [0.99]), return_samples=True))
    assert resp.status_code == 200, resp.text
    ttc = resp.json()["ttc"]
    rule = ttc["search"]["optimal"]
    assert rule["bin"] == 1 and rule["choice"] == "beam, width 8" and rule["agreement"] < 0.99, rule
    assert ttc["answer"] == "42" and ttc["samples_drawn"] > 4


async def test_compute_optimal_keeps_sampling_where_the_probe_agrees() -> None:
    easy = {"": [("I subtract first", 1.0)], **{k: v for k, v in TREE.items() if k}}
    table = [{"method": "majority", "width": 6}, {"method": "beam", "width": 8}]
    tree = FakeTree(easy)
    resp = await post(tree, FakePRM(PRM), ask(optimal(table, [0.99])))
    ttc = resp.json()["ttc"]
    assert ttc["search"]["optimal"] == {"agreement": 1.0, "bin": 0, "choice": "majority, width 6"}
    assert ttc["samples_drawn"] == 6 and ttc["answer"] == "42"
    assert [b["n"] for b in tree.bodies] == [4, 2]  # the probe, then the rest of the majority


@pytest.mark.parametrize("spec", [policy("beam"), optimal([{"method": "majority", "width": 8}], [])],
                         ids=["search", "compute-optimal"])
async def test_search_needs_a_step_scoring_verifier(spec: dict[str, Any]) -> None:
    bodies = [{**spec, "verifier": None, "aggregator": "majority"},
              {**spec, "verifier": {"name": "reference"}, "aggregator": "majority"}]
    for body in bodies:
        resp = await post(FakeTree(TREE), FakePRM(PRM), ask(body))
        assert resp.status_code == 400, resp.text
        err = resp.json()["error"]
        assert err["param"] == "ttc.policy.verifier" and "likelihood" in err["message"], err


@pytest.mark.parametrize(("search", "param", "code"), [
    ({"bogus": 1}, "ttc.policy.search.bogus", "unknown_field"),
    ({"width": 0}, "ttc.policy.search.width", None),
    ({"step_tokens": 2_048}, "ttc.policy.search.step_tokens", "too_large"),  # above limits.max_tokens (1,024)
])
async def test_bad_search_parameters_are_400s_naming_the_field(search: dict[str, Any], param: str,
                                                                code: str | None) -> None:
    tree = FakeTree(TREE)
    settings = fake_settings(["gen"], limits={"max_tokens": 1024})
    async with service_client(settings, {"gen": tree, "prm": FakePRM(PRM)}) as c:
        resp = await c.post("/v1/chat/completions", json=ask(policy("beam", **search)))
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == param and (code is None or err["code"] == code)
    assert tree.bodies == []  # refused before anything was generated
