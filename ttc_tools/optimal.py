"""Fitting the compute-optimal table (``ttc optimal fit``), and measuring strategies per difficulty.

Every candidate strategy (``majority:16``, ``beam:8``, ...) is run on every problem through a running
service, as the compute-optimal policy itself with a table that gives every bin that candidate: the
probe (seeded by the problem, so every candidate sees the same probe and the same bin) estimates the
problem's difficulty, then the candidate spends the rest. From the outcomes, per bin: the candidate
with the best accuracy, or, among those within ``tolerance`` of it, the one that generated the fewest
tokens. The table goes into a policy (JSON, and optionally installed through the policy API).

The same measurements per problem *level* (the demo generator's difficulty) give the README's table of
accuracy against tokens for each strategy.
"""

from __future__ import annotations

import asyncio
import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from app.answers import equivalent


@dataclass(frozen=True)
class Problem:
    id: str
    question: str
    gold: str
    level: int = 0


@dataclass(frozen=True)
class Outcome:
    """One problem under one candidate: the probe's bin, whether the answer was right, and its cost
    (completion tokens generated; prompt tokens of every call, the PRM's included)."""

    problem: str
    level: int
    candidate: str
    bin: int
    correct: bool
    completion_tokens: int
    prompt_tokens: int
    samples: int
    error: str | None = None


def candidate(label: str) -> dict[str, Any]:
    """``method:width`` as a table entry (``majority:16``, ``beam:8``, ``dvts:8``, ``particles:8``)."""
    method, _, width = label.partition(":")
    if method not in ("majority", "beam", "dvts", "particles") or not width.isdigit():
        raise ValueError(f"candidate {label!r}: use method:width with method majority, beam, dvts or particles")
    return {"method": method, "width": int(width)}


def policy_for(base: dict[str, Any], probe: int, bins: Sequence[float],
               table: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The compute-optimal policy: ``base`` (its verifier, aggregator and search step settings) with the
    rule."""
    return {**base, "optimal": {"probe": probe, "bins": list(bins), "table": list(table)}}


async def measure(client: httpx.AsyncClient, model: str, problems: Sequence[Problem], base: dict[str, Any],
                  candidates: Sequence[str], *, probe: int, bins: Sequence[float], seed: int = 0,
                  concurrency: int = 4, temperature: float = 1.0,
                  progress: Callable[[], None] | None = None) -> list[Outcome]:
    """Every candidate on every problem (see the module doc), ``concurrency`` requests at a time."""
    gate = asyncio.Semaphore(concurrency)

    async def one(p: Problem, label: str, i: int) -> Outcome:
        spec = policy_for(base, probe, bins, [candidate(label)] * (len(bins) + 1))
        body = {"model": model, "messages": [{"role": "user", "content": p.question}], "temperature": temperature,
                "seed": seed * 100_003 + i, "ttc": {"policy": spec}}
        async with gate:
            resp = await client.post("/v1/chat/completions", json=body)
        if progress is not None:
            progress()
        if resp.status_code != 200:
            return Outcome(p.id, p.level, label, -1, False, 0, 0, 0, error=resp.text[:300])
        data = resp.json()
        ttc, usage = data["ttc"], data["usage"]
        answer = ttc.get("answer")
        right = answer is not None and await asyncio.to_thread(equivalent, str(answer), p.gold)
        rule = (ttc.get("search") or {}).get("optimal") or {}
        return Outcome(p.id, p.level, label, int(rule.get("bin", -1)), bool(right), usage["completion_tokens"],
                       usage["prompt_tokens"], ttc["samples_drawn"])

    jobs = [one(p, label, i) for i, p in enumerate(problems) for label in candidates]
    return list(await asyncio.gather(*jobs))


def summarise(outcomes: Sequence[Outcome], key: Callable[[Outcome], int]) -> dict[int, dict[str, dict[str, float]]]:
    """Per group (a bin or a level) and candidate: problems, accuracy, mean completion and prompt tokens."""
    groups: dict[int, dict[str, list[Outcome]]] = {}
    for o in outcomes:
        if o.error is None:
            groups.setdefault(key(o), {}).setdefault(o.candidate, []).append(o)
    return {g: {c: {"n": len(rows), "accuracy": statistics.fmean(r.correct for r in rows),
                    "completion_tokens": statistics.fmean(r.completion_tokens for r in rows),
                    "prompt_tokens": statistics.fmean(r.prompt_tokens for r in rows)}
                for c, rows in sorted(by.items())}
            for g, by in sorted(groups.items())}


def fit(outcomes: Sequence[Outcome], bins: int, tolerance: float = 0.02,
        fallback: str = "majority:8") -> list[dict[str, Any]]:
    """The table: per bin (0 .. ``bins``), the candidate with the best accuracy or, within ``tolerance``
    of it, the fewest completion tokens; ``fallback`` for a bin no problem fell in."""
    per_bin = summarise(outcomes, lambda o: o.bin)
    table = []
    for b in range(bins + 1):
        rows = per_bin.get(b)
        if not rows:
            table.append(candidate(fallback))
            continue
        best = max(r["accuracy"] for r in rows.values())
        good = [c for c, r in rows.items() if r["accuracy"] >= best - tolerance]
        table.append(candidate(min(good, key=lambda c: rows[c]["completion_tokens"])))
    return table


def report(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """Everything measured, as JSON (per bin and per level summaries, and every outcome)."""
    return {"by_bin": summarise(outcomes, lambda o: o.bin), "by_level": summarise(outcomes, lambda o: o.level),
            "outcomes": [asdict(o) for o in outcomes]}


def dumps(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True)
