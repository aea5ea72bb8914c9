"""The console's playground in chromium: what it explains beside a request's answer (the stop rule
and its resolved params, the weighted votes, one row per streamed event, the tokens broken into parts
that add up to the usage, a reasoning model's folded thoughts), each checked against the response the
service sent."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable
from typing import Any

import pytest
from playwright.async_api import expect

from allocators.registry import builtin_allocators
from tests.browser.conftest import ADMIN_KEY, Console, screenshot, sign_in

pytestmark = pytest.mark.browser



def sse_events(text: str) -> list[dict[str, Any]]:
    """The JSON events of a server-sent stream as the service wrote it (not ``[DONE]``)."""
    out = []
    for block in text.split("\n\n"):
        data = "\n".join(line[5:].strip() for line in block.split("\n") if line.startswith("data:"))
        if data and data != "[DONE]":
            out.append(json.loads(data))
    return out


async def send(page: Any, edit: Callable[[str], str] | None = None) -> str:
    """Press Send with the request going through a route that keeps the body the service answered
    (``edit`` may change it before the page gets it); wait until the page shows that response."""
    got: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def handle(route: Any) -> None:
        resp = await route.fetch()
        text = await resp.text()
        if edit is not None:
            text = edit(text)
        await route.fulfill(response=resp, body=text)
        got.set_result(text)

    await page.route("**/v1/chat/completions", handle)
    try:
        await page.click("#pg-send")
        text = await asyncio.wait_for(got, TIMEOUT_S)
    finally:
        await page.unroute("**/v1/chat/completions", handle)
    final = final_ttc(text)
    await expect(page.locator(f'#result[data-request="{final["request_id"]}"]')).to_be_visible()
    return text


TIMEOUT_S = 20


def final_ttc(text: str) -> dict[str, Any]:
    if text.lstrip().startswith("{"):
        ttc: dict[str, Any] = json.loads(text)["ttc"]
        return ttc
    return next(ev["ttc"] for ev in sse_events(text) if ev.get("ttc") and "request_id" in ev["ttc"])


def usage_of(text: str) -> dict[str, int]:
    if text.lstrip().startswith("{"):
        usage: dict[str, int] = json.loads(text)["usage"]
        return usage
    return next(ev["usage"] for ev in sse_events(text) if ev.get("usage"))


def g(x: float) -> str:
    """A number as the console writes a param (0.5, 12, 0 for 0.0)."""
    return f"{x:g}"


async def use_inline(page: Any, spec: dict[str, Any], stream: bool = False) -> None:
    await page.check("#pg-use-inline")
    await page.fill("#pg-inline", json.dumps(spec))
    await (page.check if stream else page.uncheck)("#pg-stream")


async def test_the_stop_rule_and_resolved_params_show_beside_the_stop_reason(page: Any, console: Console) -> None:
    await sign_in(page, ADMIN_KEY, "#/playground")
    await page.fill("#pg-policy", "confident")
    ttc = final_ttc(await send(page))
    params = ttc["policy"]["params"]
    assert ttc["policy"]["allocator"] == "margin" and params["margin"] == 0.5 and params["max_samples"] == 8
    rule = page.locator("#pg-rule")
    await expect(rule).to_contain_text("margin: stop when the leader's weighted vote leads by ≥ 0.5 (cap 8")
    # the resolved params, every one of them, not only the stored spec's cap
    stored = (await console.api.get("/v1/policies/confident")).json()["spec"]["params"]
    assert stored == {"max_samples": 8}
    shown = await page.locator("#pg-policy-params code").inner_text()
    assert shown == ", ".join(f"{k}={v if not isinstance(v, float) else g(v)}" for k, v in params.items())
    await expect(page.locator("#pg-policy-params")).to_contain_text("verifier likelihood")
    await screenshot(page, "playground-stop-rule")

    # an inline spec with its own threshold and cap, streamed: the rule says them
    await use_inline(page, {"allocator": "adaptive_consistency", "params": {"threshold": 0.8, "max_samples": 7},
                            "schedule": "stream"}, stream=True)
    ttc = final_ttc(await send(page))
    assert ttc["policy"]["params"]["threshold"] == 0.8
    await expect(rule).to_have_text("adaptive_consistency: stop when P(leader is the majority) ≥ 0.8, after ≥ 2 "
                                    "samples (cap 7; gives up after 3 samples without an answer)")
    await expect(page.locator("#pg-policy-params code")).to_contain_text("threshold=0.8, min_samples=2, max_samples=7")

    # an allocator the console has no rule for (a plugin): its name and every param
    def plugin(text: str) -> str:
        body = json.loads(text)
        body["ttc"]["policy"].update(allocator="my_plugin", params={"alpha": 2, "levels": [1, 2]})
        return json.dumps(body)

    await use_inline(page, {"allocator": "fixed", "params": {"n": 2}})
    await send(page, plugin)
    await expect(rule).to_have_text('my_plugin: no built-in rule; params alpha=2, levels=[1,2]')


async def test_every_builtin_allocator_has_a_rule_naming_its_thresholds(page: Any, console: Console) -> None:
    named = {"margin": ["margin", "max_samples"],
             "calibrated_margin": ["quantile", "history", "margin", "min_history", "max_samples"],
             "adaptive_consistency": ["threshold", "min_samples", "max_samples"],
             "esc": ["window", "max_samples"], "deepconf": ["consensus", "warmup", "max_samples"], "fixed": ["n"],
             "uniform": ["n"], "elimination": ["gamma", "consistency_threshold", "min_samples", "max_samples"],
             "greedy": ["gamma", "consistency_threshold", "min_value", "max_samples"],
             "two_stage": ["explore_fraction", "hopeless_share", "n"], "difficulty": ["max_samples"]}
    assert set(named) == set(builtin_allocators())  # a new built-in needs a rule in explain.js
    await sign_in(page, ADMIN_KEY, "#/playground")
    for name, cls in builtin_allocators().items():
        params = cls.Params().model_dump()
        rule = await page.evaluate("async (p) => (await import('/ui/explain.js')).stopRule(p)",
                                   {"allocator": name, "params": params})
        assert rule.startswith(f"{name}: ") and "no built-in rule" not in rule and "?" not in rule, rule
        for key in named[name]:
            assert g(params[key]) in rule, (name, key, rule)


async def test_search_and_compute_optimal_builtins_say_what_they_do(page: Any, console: Console) -> None:
    """A search runs the fixed allocator, but "draws n samples" would be wrong: the rule says the search."""
    from app.policy import BUILTIN_POLICIES, parse_spec

    await sign_in(page, ADMIN_KEY, "#/playground")
    expected = {"beam": "beam search: 8 solutions", "dvts": "dvts search: 8 solutions",
                "particles": "particles search: 8 solutions", "compute-optimal": "compute-optimal: 4 probe samples"}
    for name, start in expected.items():
        spec = parse_spec(dict(BUILTIN_POLICIES[name])).model_dump(exclude_none=True)
        rule = await page.evaluate("async (p) => (await import('/ui/explain.js')).stopRule(p)", spec)
        assert rule.startswith(start) and "?" not in rule and "draws n" not in rule, rule
        if name == "compute-optimal":
            assert rule.endswith("majority 4 / majority 8 / particles 8 / majority 16"), rule
        else:
            assert "12 steps of ≤ 48 tokens" in rule, rule


async def test_weighted_votes_show_their_weights_beside_the_counts(page: Any, console: Console) -> None:
    await sign_in(page, ADMIN_KEY, "#/playground")
    await use_inline(page, {"allocator": "fixed", "params": {"n": 6}, "aggregator": "weighted_majority",
                            "verifier": "likelihood"})
    ttc = final_ttc(await send(page))
    votes, weights = ttc["votes"], ttc["answer_scores"]
    assert votes and set(weights) == set(votes)
    items = page.locator("#pg-votes li")
    await expect(items).to_have_count(len(votes))
    for answer, n in votes.items():
        text = await page.locator(f'#pg-votes li[data-answer="{answer}"]').inner_text()
        head, w = text.split(" (w ")
        assert head == f"{answer}: {n}" and abs(float(w.rstrip(")")) - weights[answer]) <= 0.005 + 1e-9, text
    first = await items.first.get_attribute("data-answer")
    assert first == ttc["answer"]  # listed in the aggregator's order: the most weight first
    await expect(page.locator("#pg-votes-by")).to_contain_text("summed verifier weight")
    await screenshot(page, "playground-weights")

    # best-of-n ranks by the best score; plain majority shows counts only
    await use_inline(page, {"allocator": "fixed", "params": {"n": 4}, "aggregator": "best_of_n",
                            "verifier": "likelihood"})
    ttc = final_ttc(await send(page))
    answer, n = next(iter(ttc["votes"].items()))
    await expect(page.locator(f'#pg-votes li[data-answer="{answer}"]')).to_have_text(
        f"{answer}: {n} (best {ttc['answer_scores'][answer]:.2f})")
    await use_inline(page, {"allocator": "fixed", "params": {"n": 4}, "aggregator": "majority"})
    ttc = final_ttc(await send(page))
    items = page.locator("#pg-votes li")
    await expect(items).to_have_count(len(ttc["votes"]))
    for a, n in ttc["votes"].items():  # expect retries until the page shows this response, not the one before
        await expect(page.locator(f'#pg-votes li[data-answer="{a}"]')).to_have_text(f"{a}: {n}")
    shown = [int((await li.inner_text()).rsplit(": ", 1)[1]) for li in await items.all()]
    assert shown == sorted(shown, reverse=True)  # most votes first (ties in no promised order)


def parse_votes(cell: str) -> dict[str, int]:
    return {a: int(n) for a, n in (part.split(": ") for part in cell.split(", "))} if cell else {}


async def growth_rows(page: Any) -> list[list[Any]]:
    """The streamed vote-growth rows: step, samples drawn, votes (a dict: a browser lists numeric keys
    in numeric order), cancelled."""
    rows = page.locator("#vote-growth tbody tr")
    out = []
    for row in await rows.all():
        step, drawn, votes, cancelled = await row.locator("td").all_inner_texts()
        out.append([step, int(drawn), parse_votes(votes), int(cancelled)])
    return out


async def test_streamed_progress_has_one_row_per_event_and_no_repeats(page: Any, console: Console) -> None:
    await sign_in(page, ADMIN_KEY, "#/playground")
    await page.fill("#pg-policy", "esc")
    await page.check("#pg-stream")
    text = await send(page)
    events = [ev["ttc"] for ev in sse_events(text) if ev.get("ttc") and "request_id" not in ev["ttc"]]
    assert events
    expected, repeats = [], 0
    for i, ev in enumerate(events):
        if i and ev == events[i - 1]:  # an event that carries no change
            repeats += 1
            continue
        expected.append([f"event {i + 1} · round {ev['round']}", ev["samples_drawn"], ev["votes"],
                         ev["samples_cancelled"]])
    rows = await growth_rows(page)
    assert rows == expected
    assert all(a != b for a, b in itertools.pairwise(rows))
    note = page.locator("#pg-growth-note")
    await expect(note).to_contain_text(f"{len(events)} progress event(s), {len(rows)} row(s)")
    if repeats:
        await expect(note).to_contain_text(f"{repeats} event(s) repeated the one before")
    await screenshot(page, "playground-stream")

    # a stream whose events repeat: each repeat is dropped, a change in the cancelled count is a row
    def repeating(text: str) -> str:
        events = sse_events(text)
        final = next(i for i, ev in enumerate(events) if ev.get("ttc") and "request_id" in ev["ttc"])
        base = {k: v for k, v in events[0].items() if k != "choices"} | {"choices": [
            {"index": 0, "delta": {}, "finish_reason": None}]}
        progress = [{"round": 1, "samples_drawn": 1, "samples_cancelled": 0, "votes": {"42": 1}},
                    {"round": 1, "samples_drawn": 1, "samples_cancelled": 0, "votes": {"42": 1}},
                    {"round": 1, "samples_drawn": 2, "samples_cancelled": 0, "votes": {"42": 1, "41": 1}},
                    {"round": 1, "samples_drawn": 2, "samples_cancelled": 0, "votes": {"41": 1, "42": 1}},
                    {"round": 1, "samples_drawn": 2, "samples_cancelled": 1, "votes": {"41": 1, "42": 1}}]
        made = [events[0], *({**base, "ttc": p} for p in progress), *events[final - 1:]]
        return "".join(f"data: {json.dumps(ev)}\n\n" for ev in made) + "data: [DONE]\n\n"

    await use_inline(page, {"allocator": "fixed", "params": {"n": 2}, "schedule": "stream"}, stream=True)
    await send(page, repeating)
    assert await growth_rows(page) == [["event 1 · round 1", 1, {"42": 1}, 0],
                                       ["event 3 · round 1", 2, {"41": 1, "42": 1}, 0],
                                       ["event 5 · round 1", 2, {"41": 1, "42": 1}, 1]]
    await expect(page.locator("#pg-growth-note")).to_have_text(
        "5 progress event(s), 3 row(s): 2 event(s) repeated the one before (no change) and are not shown again")


async def token_parts(page: Any) -> dict[str, tuple[str, int]]:
    out = {}
    for row in await page.locator("#pg-token-parts tbody tr").all():
        part = await row.get_attribute("data-part")
        cells = await row.locator("td").all_inner_texts()
        out[part] = (cells[0], int(cells[1].replace(",", "")))
    return out


async def test_the_tokens_break_down_into_parts_that_add_up_to_usage(page: Any, console: Console) -> None:
    await sign_in(page, ADMIN_KEY, "#/playground")
    await page.fill("#pg-policy", "self-consistency-8")
    text = await send(page)
    ttc, usage = final_ttc(text), usage_of(text)
    parts = await token_parts(page)
    assert parts["samples"][1] == sum(smp["tokens"] for smp in ttc["samples"])
    assert parts["cancelled"][1] == ttc["tokens_cancelled"]
    assert parts["completion"][1] == usage["completion_tokens"] == parts["samples"][1] + parts["cancelled"][1]
    assert parts["prompt"][1] == usage["prompt_tokens"] and parts["total"][1] == usage["total_tokens"]
    assert "difference" not in parts
    await expect(page.locator("#pg-token-check")).to_have_text("The parts add up to usage.")

    # a judge's calls: the rest of the completion tokens, labelled as the verifier's
    await use_inline(page, {"allocator": "fixed", "params": {"n": 3}, "aggregator": "weighted_majority",
                            "verifier": "llm_judge"})
    text = await send(page)
    ttc, usage = final_ttc(text), usage_of(text)
    parts = await token_parts(page)
    judge = usage["completion_tokens"] - sum(smp["tokens"] for smp in ttc["samples"]) - ttc["tokens_cancelled"]
    assert judge > 0 and parts["verifier"] == ("verifier calls (llm_judge)", judge)
    await expect(page.locator("#pg-token-check")).to_have_text("The parts add up to usage.")
    await screenshot(page, "playground-tokens")

    # streamed, where samples are cancelled once the query is decided: their tokens are a part of their own
    spec = {"allocator": "margin", "params": {"max_samples": 6, "margin": 1.5}, "aggregator": "weighted_majority",
            "verifier": "likelihood", "schedule": {"mode": "stream", "width": 8}}
    await use_inline(page, spec, stream=True)
    text = await send(page)
    ttc, usage = final_ttc(text), usage_of(text)
    parts = await token_parts(page)
    assert parts["cancelled"] == (f"cancelled samples ({ttc['samples_cancelled']})", ttc["tokens_cancelled"])
    assert parts["samples"][1] + parts["cancelled"][1] == usage["completion_tokens"] == parts["completion"][1]

    # usage that the parts do not explain: the difference is shown, labelled, never hidden
    def inflate(text: str) -> str:
        body = json.loads(text)
        body["usage"]["completion_tokens"] += 7
        body["usage"]["total_tokens"] += 7
        return json.dumps(body)

    await use_inline(page, {"allocator": "fixed", "params": {"n": 2}})
    await send(page, inflate)
    parts = await token_parts(page)
    assert parts["difference"] == ("difference (not accounted for)", 7)
    await expect(page.locator('#pg-token-parts tr.mismatch[data-part="difference"]')).to_be_visible()
    await expect(page.locator("#pg-token-check")).to_have_text(
        "The parts do not add up to usage: the difference is shown above.")
    await expect(page.locator('#pg-token-parts tr[data-part="completion"]')).to_contain_text("7 short")
    await screenshot(page, "playground-tokens-mismatch")


async def test_a_reasoning_models_thoughts_show_folded_beside_each_answer(page: Any, console: Console) -> None:
    console.fake.reasoning_field = "reasoning"  # the fake answers like vLLM with a reasoning parser
    try:
        await sign_in(page, ADMIN_KEY, "#/playground")
        await page.fill("#pg-prompt", "What is 2 + 40? think=12")
        await page.fill("#pg-policy", "self-consistency-8")
        await page.click("#pg-send")
        thoughts = page.locator("#samples tbody tr details.thought")
        await expect(thoughts).to_have_count(8)
        first = thoughts.first
        await expect(first.locator("summary")).to_have_text("thought · 12 tokens")
        await expect(first.locator("pre")).to_be_hidden()  # folded until asked for
        await first.locator("summary").click()
        await expect(first.locator("pre")).to_be_visible()
        await expect(first.locator("pre")).to_contain_text("Let me think:")
        await screenshot(page, "playground-thoughts")
    finally:
        console.fake.reasoning_field = None
