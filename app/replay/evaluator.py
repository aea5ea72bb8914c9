"""Offline evaluation of a policy on recorded samples, through the service's own engine loop.

One *run* is one ``(budget, seed)``: every problem of the file is one query of ONE batch, served by a
:class:`~app.backends.replay.ReplaySource` for that seed, with ``RunLimits(samples=round(b * P))``
(``b`` the mean budget, ``P`` the number of problems), exactly as the batch endpoint would run it.

What the budget means depends on the allocator:

* batch (budget-driven) allocators (``elimination``, ``uniform``, ``two_stage``, ``difficulty``, ...)
  share the ``round(b * P)`` samples; each query is capped at ``min(n_p, --cap)``;
* per-query allocators (subclasses of :class:`~allocators.single.PerQueryAllocator`: ``fixed``,
  ``adaptive_consistency``, ``esc``) decide per query, so the budget is their **per-query cap**:
  query ``p`` gets ``cap_p = min(n_p, --cap, b_p)`` (``b_p`` from
  :func:`~app.replay.baselines.per_problem_budgets`), and their own cap parameter (``n`` or
  ``max_samples``), unless ``--params`` (or the built-in policy) sets it, is raised to ``ceil(b)``
  when below, so that the budget is what binds. Their mean samples are what they actually drew
  (at most ``b``).

Per run and problem: samples drawn, *accuracy* (the recorded ``correct`` flag of the sample the
aggregator selected; no sample: wrong) and *coverage* (some drawn sample is correct). A row averages
over problems and seeds; its 95% interval is a percentile bootstrap over problems of the per-problem
means across seeds (:class:`Bootstrap`). The *compute-efficiency ratio* of a row is the mean samples
uniform needs to reach the row's accuracy (linear interpolation on uniform's curve at budgets
``0..N``) divided by the row's mean samples; ``None`` where uniform never reaches it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from allocators.registry import available as available_allocators
from allocators.single import PerQueryAllocator
from app.answers import AnswerSpec, ParsePool
from app.backends.base import SamplingRequest
from app.backends.replay import Problem, ReplaySource
from app.engine import Engine, Query, RunLimits
from app.policy import BUILTIN_POLICIES, PolicyParts, build_parts
from app.replay import baselines
from app.replay.baselines import Outcomes
from app.replay.keys import ReplayKeys, compute_keys
from app.replay.verifier import make_verifier, scores_are_logits
from app.wire import PolicySpec

VERIFIERS = ("none", "ground_truth", "scores", "likelihood")
_AXIS_PARAMS = ("n", "max_samples")


class ReplayConfigError(ValueError):
    """A replay cannot run as asked (unknown policy, bad params, verifier without data, ...)."""


@dataclass(frozen=True, slots=True)
class ReplayPolicy:
    """A policy as the evaluator runs it: a spec (without verifier) plus the replay verifier mode."""

    name: str
    spec: PolicySpec
    verifier: str = "none"
    score_logits: bool = False

    @property
    def answer(self) -> AnswerSpec | None:
        return self.spec.answer

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, **self.spec.model_dump(exclude_none=True), "verifier": self.verifier}


def default_aggregator(verifier: str) -> str:
    """``majority`` without a verifier; with one, ``weighted_majority`` (votes weighted by verifier
    score), so that the verifier also picks the answer and not only decides when to stop."""
    return "majority" if verifier == "none" else "weighted_majority"


def resolve_policy(name: str, params: Mapping[str, Any] | None = None, aggregator: str | None = None,
                   verifier: str | None = None, answer: AnswerSpec | None = None) -> ReplayPolicy:
    """``name`` is a built-in policy (``app.policy.BUILTIN_POLICIES``) or an allocator name; ``params``
    are merged over the built-in's; ``verifier`` defaults to the built-in's own when replay can run it
    (``likelihood``), else ``none``; ``aggregator`` defaults to :func:`default_aggregator`; ``answer``
    is the answer kind (default ``auto``). Raises :class:`ReplayConfigError` for unknown names or params."""
    if verifier is None:
        own = (BUILTIN_POLICIES.get(name, {}).get("verifier") or {}).get("name")
        verifier = own if own in VERIFIERS else "none"
    if verifier not in VERIFIERS:
        raise ReplayConfigError(f"unknown verifier {verifier!r}; use one of {', '.join(VERIFIERS)}")
    aggregator = aggregator or default_aggregator(verifier)
    if name in BUILTIN_POLICIES:
        base = dict(BUILTIN_POLICIES[name])
        merged = {**dict(base.get("params") or {}), **dict(params or {})}
        data: dict[str, Any] = {"allocator": base["allocator"], "params": merged, "aggregator": aggregator}
    elif name in available_allocators():
        data = {"allocator": name, "params": dict(params or {}), "aggregator": aggregator}
    else:
        known = sorted({*BUILTIN_POLICIES, *available_allocators()})
        raise ReplayConfigError(f"unknown policy {name!r}; known: {', '.join(known)}")
    if answer is not None:
        data["answer"] = answer
    try:
        spec = PolicySpec.model_validate(data)
        policy = ReplayPolicy(name, spec, verifier)
        build(policy, 1.0, 0)
    except ReplayConfigError:
        raise
    except Exception as exc:  # pydantic ValidationError (wrapped by build_parts), unknown aggregator, ...
        raise ReplayConfigError(f"policy {name!r}: {getattr(exc, 'error', exc)}") from None
    return policy


def is_per_query(policy: ReplayPolicy) -> bool:
    return isinstance(build_parts(policy.spec, random.Random(0)).allocator, PerQueryAllocator)


def build(policy: ReplayPolicy, budget: float, seed: int) -> PolicyParts:
    """Fresh parts for one run (allocator state never crosses runs); see the module doc for how a
    per-query allocator's cap parameter follows the budget."""
    spec = policy.spec
    parts = build_parts(spec, random.Random(seed))
    if isinstance(parts.allocator, PerQueryAllocator):
        fields = type(parts.allocator.params).model_fields
        params = parts.allocator.params
        axis = {p: math.ceil(budget) for p in _AXIS_PARAMS
                if p in fields and p not in spec.params and getattr(params, p) < math.ceil(budget)}
        if axis:
            spec = spec.model_copy(update={"params": {**spec.params, **axis}})
            parts = build_parts(spec, random.Random(seed))
    parts.verifier = make_verifier(policy.verifier, policy.score_logits)
    if parts.aggregator.needs_verifier and parts.verifier is None:
        raise ReplayConfigError(f"aggregator {spec.aggregator!r} needs a verifier (--verifier)")
    return parts


@dataclass(frozen=True, slots=True)
class Row:
    """One budget's summary; ``*_ci`` are 95% bootstrap intervals."""

    budget: float
    mean_samples: float
    mean_samples_ci: tuple[float, float]
    accuracy: float
    accuracy_ci: tuple[float, float]
    coverage: float
    coverage_ci: tuple[float, float]

    def to_json(self) -> dict[str, Any]:
        return {"budget": self.budget, "mean_samples": self.mean_samples,
                "mean_samples_ci": list(self.mean_samples_ci), "accuracy": self.accuracy,
                "accuracy_ci": list(self.accuracy_ci), "coverage": self.coverage,
                "coverage_ci": list(self.coverage_ci)}


class Bootstrap:
    """Percentile bootstrap over problems: ``resamples`` draws of ``P`` problem indices (seeded),
    applied to the per-problem means across seeds of a ``(seeds, problems)`` matrix."""

    def __init__(self, n_problems: int, resamples: int = 1000, seed: int = 0) -> None:
        self.idx = np.random.default_rng(seed).integers(0, n_problems, size=(resamples, n_problems))

    def ci(self, values: np.ndarray) -> tuple[float, float]:
        per_problem = np.asarray(values, dtype=np.float64).mean(axis=0)
        means = per_problem[self.idx].mean(axis=1)
        lo, hi = np.percentile(means, [2.5, 97.5])
        return float(lo), float(hi)

    def row(self, budget: float, out: Outcomes) -> Row:
        return Row(budget, float(np.mean(out.samples)), self.ci(out.samples),
                   float(np.mean(out.correct)), self.ci(out.correct),
                   float(np.mean(out.covered)), self.ci(out.covered))


def uniform_needed(accuracy: float, xs: np.ndarray, ys: np.ndarray) -> float | None:
    """Mean samples at which uniform's curve ``(xs, ys)`` first reaches ``accuracy`` (linear
    interpolation between its points), ``None`` if it never does."""
    hits = np.flatnonzero(ys >= accuracy - 1e-12)
    if hits.size == 0:
        return None
    i = int(hits[0])
    if i == 0:
        return float(xs[0])
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return float(x0 + (accuracy - y0) / (y1 - y0) * (x1 - x0))


def efficiency(rows: Sequence[Row], xs: np.ndarray, ys: np.ndarray) -> list[float | None]:
    """Compute-efficiency ratio per row: uniform's mean samples for the same accuracy / the row's."""
    out: list[float | None] = []
    for r in rows:
        need = uniform_needed(r.accuracy, xs, ys)
        out.append(None if need is None or r.mean_samples <= 0 else need / r.mean_samples)
    return out


async def run_once(problems: Sequence[Problem], policy: ReplayPolicy, budget: float, seed: int,
                   cap: int | None = None, keys: ReplayKeys | None = None) -> Outcomes:
    """One ``(budget, seed)`` run of the whole file as one batch through :class:`Engine`; ``keys``
    are the answer keys computed up front (:func:`~app.replay.keys.compute_keys`)."""
    parts = build(policy, budget, seed)
    caps = [p.n if cap is None else min(p.n, cap) for p in problems]
    if isinstance(parts.allocator, PerQueryAllocator):
        caps = np.minimum(caps, baselines.per_problem_budgets(budget, len(problems))).tolist()
    queries = [
        Query(id=p.id, request=SamplingRequest("completion", "replay", prompt=p.question, query_id=p.id),
              cap=int(c), reference=p.gold, known_keys=keys.known(i, p) if keys is not None else None)
        for i, (p, c) in enumerate(zip(problems, caps, strict=True))
    ]
    engine = Engine(ReplaySource(problems, seed))
    result = await engine.run(queries, parts, RunLimits(samples=round(budget * len(problems))), seed=seed)
    samples = np.zeros(len(problems))
    correct = np.zeros(len(problems), dtype=bool)
    covered = np.zeros(len(problems), dtype=bool)
    for i, run in enumerate(result.runs):
        samples[i] = run.state.spent
        covered[i] = any(bool(d.correct) for d in run.draws)
        sel = run.selection
        correct[i] = sel is not None and bool(run.draws[sel.index].correct)
    return Outcomes(samples, correct, covered)


@dataclass(slots=True)
class Report:
    """Everything ``ttc replay`` prints and writes (:meth:`to_json`)."""

    policy: ReplayPolicy
    data: str
    n_problems: int
    seeds: int
    cap: int | None
    rows: list[Row]
    uniform: list[Row]
    oracle: list[Row]
    efficiency: list[float | None]
    uniform_curve: tuple[list[float], list[float]]
    pass_at_1: float
    majority_at_k: float
    k: int
    per_query: bool
    wall_s: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    key_stats: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy.name, "spec": self.policy.describe(), "data": self.data,
            "problems": self.n_problems, "seeds": self.seeds, "cap": self.cap,
            "budget_axis": "per-query cap" if self.per_query else "shared mean budget",
            "rows": [r.to_json() for r in self.rows],
            "uniform": [r.to_json() for r in self.uniform],
            "oracle": [r.to_json() for r in self.oracle],
            "efficiency": self.efficiency,
            "pass_at_1": self.pass_at_1, "majority_at_k": {"k": self.k, "accuracy": self.majority_at_k},
            "wall_s": self.wall_s, "answer": self.policy.answer.model_dump() if self.policy.answer else None,
            "answer_keys": self.key_stats,
        }


def evaluate(
    problems: Sequence[Problem], policy: ReplayPolicy, budgets: Sequence[float], seeds: int, *,
    cap: int | None = None, resamples: int = 1000, on_run: Callable[[], None] | None = None,
    workers: int | None = None,
) -> Report:
    """Run ``policy`` at every budget for seeds ``0..seeds-1`` and compute the reference curves.
    Answer keys are computed once, up front, with ``workers`` processes (default: one per core)."""
    if not budgets or any(b <= 0 for b in budgets):
        raise ReplayConfigError("budgets must be positive numbers")
    if seeds < 1:
        raise ReplayConfigError("seeds must be >= 1")
    if policy.verifier == "scores":
        missing = [p.id for p in problems if p.scores is None]
        if missing:
            raise ReplayConfigError(
                f"--verifier scores needs a 'scores' list on every problem; {len(missing)} problem(s) "
                f"have none (first: {missing[0]!r})")
        policy = dataclasses.replace(policy, score_logits=scores_are_logits(problems))
    if policy.verifier == "likelihood":
        missing = [p.id for p in problems if p.logprobs is None or p.tokens is None or None in p.logprobs]
        if missing:
            raise ReplayConfigError(
                f"--verifier likelihood needs 'logprobs' and 'tokens' lists on every problem; {len(missing)} "
                f"problem(s) lack them (first: {missing[0]!r})")
    t0, c0 = time.perf_counter(), time.process_time()
    seed_list = list(range(seeds))
    outcomes: list[Outcomes] = []
    keys = ReplayKeys([])

    async def run_all() -> None:
        nonlocal keys
        pool = ParsePool(workers or os.cpu_count() or 1, max_pending=len(problems) + 1)
        try:
            keys = await compute_keys(problems, policy.answer, pool)
        finally:
            pool.close()
        for b in budgets:
            runs = []
            for s in seed_list:
                runs.append(await run_once(problems, policy, b, s, cap, keys))
                if on_run is not None:
                    on_run()
            outcomes.append(Outcomes(*(np.stack([getattr(r, f) for r in runs])
                                       for f in ("samples", "correct", "covered"))))

    asyncio.run(run_all())
    t_policy = time.perf_counter() - t0
    sh = baselines.shuffle(problems, seed_list, cap, keys.keys)
    table = baselines.uniform_table(sh)
    costs = baselines.first_correct(sh)
    boot = Bootstrap(len(problems), resamples)
    xs, ys = table.curve()
    rows = [boot.row(b, o) for b, o in zip(budgets, outcomes, strict=True)]
    report = Report(
        policy=policy, data="", n_problems=len(problems), seeds=seeds, cap=cap, rows=rows,
        uniform=[boot.row(b, table.at(b)) for b in budgets],
        oracle=[boot.row(b, baselines.oracle(costs, b)) for b in budgets],
        efficiency=efficiency(rows, xs, ys), uniform_curve=(xs.tolist(), ys.tolist()),
        pass_at_1=baselines.pass_at_1(sh), majority_at_k=float(ys[-1]), k=len(xs) - 1,
        per_query=is_per_query(policy),
    )
    report.wall_s = time.perf_counter() - t0
    report.timings = {"policy_s": t_policy, "baselines_s": report.wall_s - t_policy,
                      "cpu_s": time.process_time() - c0}
    report.key_stats = {"pooled": keys.pooled, "fallbacks": keys.fallbacks}
    return report
