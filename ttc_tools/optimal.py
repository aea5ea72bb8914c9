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
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
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


async def measure(client: httpx.AsyncClient, model: str, problems: Sequence[Problem],
                  policies: Mapping[str, dict[str, Any]], *, seed: int = 0, concurrency: int = 4,
                  temperature: float = 1.0, progress: Callable[[], None] | None = None) -> list[Outcome]:
    """Every policy (label -> inline spec) on every problem, ``concurrency`` requests at a time; a
    problem's seed is the same under every policy, so a compute-optimal probe sees the same samples."""
    gate = asyncio.Semaphore(concurrency)

    async def one(p: Problem, label: str, i: int) -> Outcome:
        body = {"model": model, "messages": [{"role": "user", "content": p.question}], "temperature": temperature,
                "seed": seed * 100_003 + i, "ttc": {"policy": policies[label]}}
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

    jobs = [one(p, label, i) for i, p in enumerate(problems) for label in policies]
    return list(await asyncio.gather(*jobs))


def candidate_policies(base: dict[str, Any], candidates: Sequence[str], *, probe: int,
                       bins: Sequence[float]) -> dict[str, dict[str, Any]]:
    """Each candidate as the compute-optimal policy whose every bin is that candidate (the fit's runs)."""
    return {label: policy_for(base, probe, bins, [candidate(label)] * (len(bins) + 1)) for label in candidates}


LIKELIHOOD: dict[str, Any] = {"name": "likelihood", "params": {"aggregate": "min"}}
"""The generator's own likelihood as a verifier: a (partial) solution scores the probability of its least
likely token (app.verifiers.likelihood)."""


def comparison_policies(base: dict[str, Any], fitted: dict[str, Any] | None, *, n: int = 16,
                        width: int = 8) -> dict[str, dict[str, Any]]:
    """What the README compares per level: a majority vote of ``n`` whole samples, best-of-``n`` and a
    weighted majority of ``n`` by the PRM, beam search, DVTS and particle filtering of ``width`` by the
    PRM, the same best-of-``n`` and searches by the generator's own likelihood (:data:`LIKELIHOOD`: a
    solution's least likely token; no model call), and the ``fitted`` compute-optimal policy."""
    verifier = base["verifier"]
    whole = {"allocator": "fixed", "params": {"n": n}}
    out: dict[str, dict[str, Any]] = {
        f"majority-{n}": {**whole, "aggregator": "majority"},
        f"best-of-{n} (PRM)": {**whole, "aggregator": "best_of_n", "verifier": verifier},
        f"weighted-{n} (PRM)": {**whole, "aggregator": "weighted_majority", "verifier": verifier},
        f"best-of-{n} (likelihood)": {**whole, "aggregator": "best_of_n", "verifier": LIKELIHOOD},
    }
    for scorer, suffix in ((verifier, ""), (LIKELIHOOD, " (likelihood)")):
        for method in ("beam", "dvts", "particles"):
            out[f"{method}-{width}{suffix}"] = {"allocator": "fixed", "aggregator": "best_of_n", "verifier": scorer,
                                                "search": {**base["search"], "method": method, "width": width}}
    if fitted is not None:
        out["compute-optimal"] = fitted
    return out


def wilson(k: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion ``k / n`` (95% by default)."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def summarise(outcomes: Sequence[Outcome], key: Callable[[Outcome], int]) -> dict[int, dict[str, dict[str, Any]]]:
    """Per group (a bin or a level) and candidate: problems, accuracy and its 95% interval (``ci``), mean
    completion and prompt tokens."""
    groups: dict[int, dict[str, list[Outcome]]] = {}
    for o in outcomes:
        if o.error is None:
            groups.setdefault(key(o), {}).setdefault(o.candidate, []).append(o)
    return {g: {c: {"n": len(rows), "accuracy": statistics.fmean(r.correct for r in rows),
                    "ci": wilson(sum(r.correct for r in rows), len(rows)),
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


def markdown(by_level: Mapping[int, Mapping[str, Mapping[str, Any]]]) -> str:
    """The per-level comparison as a markdown table: accuracy [95% CI], completion tokens (what the
    generator generated) and prompt tokens (every call's, the PRM's included) per query."""
    lines = ["| level | policy | problems | accuracy [95% CI] | completion tokens / query | prompt tokens / query |",
             "|---|---|---|---|---|---|"]
    for level, rows in by_level.items():
        for label, r in rows.items():
            lo, hi = r["ci"]
            lines.append(f"| {level} | {label} | {r['n']} | {r['accuracy']:.2f} [{lo:.2f}, {hi:.2f}] | "
                         f"{r['completion_tokens']:.0f} | {r['prompt_tokens']:.0f} |")
    return "\n".join(lines) + "\n"


def plot(by_level: Mapping[int, Mapping[str, Mapping[str, Any]]], path: Any) -> None:
    """Accuracy (95% interval) against completion tokens per query, one panel per level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = list(by_level)
    labels = sorted({label for rows in by_level.values() for label in rows})
    width = max(3.2 * len(levels), 6.4)
    ncol = max(1, min(len(labels), int(width / 2.1)))  # legend columns that fit the figure's width
    legend_in = 0.2 * math.ceil(len(labels) / ncol) + 0.15
    fig, axes = plt.subplots(1, len(levels), figsize=(width, 3.6 + legend_in), sharey=True, squeeze=False)
    palette = plt.get_cmap("tab10" if len(labels) <= 10 else "tab20")
    colours = {label: palette(i % palette.N) for i, label in enumerate(labels)}
    for ax, level in zip(axes[0], levels, strict=True):
        for label, r in by_level[level].items():
            lo, hi = r["ci"]
            ax.errorbar([r["completion_tokens"]], [r["accuracy"]], yerr=[[r["accuracy"] - lo], [hi - r["accuracy"]]],
                        fmt="o", color=colours[label], label=label, capsize=2)
        ax.set_title(f"level {level}")
        ax.set_xlabel("completion tokens / query")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("accuracy")
    handles = [plt.Line2D([], [], marker="o", linestyle="", color=colours[label]) for label in labels]
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, legend_in / (3.6 + legend_in), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
