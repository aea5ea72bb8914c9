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
aggregator selected; no sample: wrong) and *coverage* (some drawn sample is correct), summarised
per budget by :mod:`app.replay.summary` (bootstrap intervals, compute-efficiency ratio).

**Code problems** (those with ``tests``, see :mod:`app.backends.replay`) need the sandbox. Before the
runs, every distinct program is executed on its problem's tests once
(:func:`~app.replay.verifier.execute_programs`, through one :class:`~app.code.runner.CodeRunner`;
:func:`code_runner` builds the default, bubblewrap with one program per core), and each sample's
``correct`` flag becomes *its program passes all the tests*, whatever the verifier (so runs with
different verifiers are scored alike; a recorded ``correct`` list is only compared with it,
``code.recorded_mismatch``). With ``--verifier code_tests`` the outcomes (fraction of tests passed,
or 1/0) are the verifier's scores during the runs. Answer keys under the ``code`` kind
(:func:`default_answer` picks it for a file of code problems) are computed once too, by behaviour
on the prompt's doctest inputs when there are any (:mod:`app.replay.keys`).
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

from allocators import PerQueryAllocator
from allocators import available as available_allocators
from app.answers import AnswerSpec, ParsePool
from app.backends.base import SamplingRequest
from app.backends.replay import Problem, ReplayFormatError, ReplaySource, check_traces
from app.code.runner import CodeRunner
from app.engine import Engine, Query, QueryRun, RunLimits
from app.policy import BUILTIN_POLICIES, PolicyParts, build_parts
from app.protocol import PolicySpec
from app.replay import baselines
from app.replay.baselines import Outcomes
from app.replay.keys import ReplayKeys, compute_keys
from app.replay.summary import Bootstrap, Row, efficiency
from app.replay.verifier import (
    CodeResults,
    code_runner,
    code_stats,
    execute_programs,
    make_verifier,
    scores_are_logits,
)
from app.sandbox import SandboxUnavailable

VERIFIERS = ("none", "ground_truth", "scores", "likelihood", "code_tests")
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
    verifier_params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def answer(self) -> AnswerSpec | None:
        return self.spec.answer

    def describe(self) -> dict[str, Any]:
        out = {"name": self.name, **self.spec.model_dump(exclude_none=True), "verifier": self.verifier}
        if self.verifier_params:
            out["verifier_params"] = dict(self.verifier_params)
        return out


def default_aggregator(verifier: str) -> str:
    """``majority`` without a verifier; with one, ``weighted_majority`` (votes weighted by verifier
    score), so that the verifier also picks the answer and not only decides when to stop."""
    return "majority" if verifier == "none" else "weighted_majority"


def resolve_policy(name: str, params: Mapping[str, Any] | None = None, aggregator: str | None = None,
                   verifier: str | None = None, answer: AnswerSpec | None = None,
                   verifier_params: Mapping[str, Any] | None = None, schedule: str | None = None,
                   priority: str | None = None) -> ReplayPolicy:
    """``name`` is a built-in policy (``app.policy.BUILTIN_POLICIES``) or an allocator name; ``params``
    are merged over the built-in's; ``verifier`` defaults to the built-in's own when replay can run it
    (``likelihood``, with the built-in's params), else ``none``; ``verifier_params`` are the
    ``code_tests`` verifier's (``score``: ``fraction`` | ``all``) or the ``likelihood`` verifier's
    (``temperature``); ``aggregator`` defaults to :func:`default_aggregator`; ``answer`` is the
    answer kind (default ``auto``); ``schedule`` is ``rounds`` (default, whatever the built-in's: the
    samples are the same, and rounds replay fastest) or ``stream`` (the default for an allocator that
    monitors traces, ``deepconf``, as its built-in policy streams: a query is decided as its traces
    finish); ``priority`` is a live request's ``ttc.priority``: ``tokens`` replays the stream schedule
    without speculation (never more samples running than the allocator asks for), ``latency`` or
    ``None`` with it (rounds never speculate).
    Raises :class:`ReplayConfigError` for unknown names or params, and for a built-in that searches step by
    step (``beam``, ``dvts``, ``particles``, ``compute-optimal``: recorded whole samples cannot replay it)."""
    if verifier is None:
        own_spec = BUILTIN_POLICIES.get(name, {}).get("verifier") or {}
        own = own_spec.get("name")
        verifier = own if own in VERIFIERS else "none"
        if own == "likelihood" and not verifier_params:
            verifier_params = own_spec.get("params")  # the built-in's temperature (calibrated)
    if verifier not in VERIFIERS:
        raise ReplayConfigError(f"unknown verifier {verifier!r}; use one of {', '.join(VERIFIERS)}")
    aggregator = aggregator or default_aggregator(verifier)
    if name in BUILTIN_POLICIES:
        base = dict(BUILTIN_POLICIES[name])
        if "search" in base:  # step search grows partial solutions that a file of whole samples does not hold
            raise ReplayConfigError(
                f"policy {name!r} searches step by step: recorded whole samples hold no partial solutions to "
                "grow, so they cannot replay it; measure it against the service with `ttc optimal compare`")
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
        monitors = build_parts(PolicySpec.model_validate(data), random.Random(0)).allocator.trace_monitor()
        if schedule is None and monitors:
            schedule = "stream"  # as its built-in policy: a query is decided as its traces finish
        if schedule is not None:
            data["schedule"] = {"mode": schedule, "speculate": priority != "tokens"}
        spec = PolicySpec.model_validate(data)
        policy = ReplayPolicy(name, spec, verifier, verifier_params=dict(verifier_params or {}))
        build(policy, 1.0, 0)
    except ReplayConfigError:
        raise
    except Exception as exc:  # pydantic ValidationError (wrapped by build_parts), unknown aggregator, ...
        raise ReplayConfigError(f"policy {name!r}: {getattr(exc, 'error', exc)}") from None
    return policy


def is_per_query(policy: ReplayPolicy) -> bool:
    return isinstance(build_parts(policy.spec, random.Random(0)).allocator, PerQueryAllocator)


def build(policy: ReplayPolicy, budget: float, seed: int, code: CodeResults | None = None) -> PolicyParts:
    """Fresh parts for one run (allocator state never crosses runs); see the module doc for how a
    per-query allocator's cap parameter follows the budget. ``code``: the executed outcomes the
    ``code_tests`` verifier scores with."""
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
    parts = dataclasses.replace(parts, verifier=make_verifier(policy.verifier, policy.score_logits,
                                                            params=policy.verifier_params, code=code))
    if parts.aggregator.needs_verifier and parts.verifier is None:
        raise ReplayConfigError(f"aggregator {spec.aggregator!r} needs a verifier (--verifier)")
    return parts


async def run_once(problems: Sequence[Problem], policy: ReplayPolicy, budget: float, seed: int,
                   cap: int | None = None, keys: ReplayKeys | None = None, code: CodeResults | None = None) -> Outcomes:
    """One ``(budget, seed)`` run of the whole file as one batch through :class:`Engine`; ``keys``
    are the answer keys and ``code`` the executed tests, both computed up front
    (:func:`~app.replay.keys.compute_keys`, :func:`~app.replay.verifier.execute_programs`)."""
    parts = build(policy, budget, seed, code)
    caps = [p.n if cap is None else min(p.n, cap) for p in problems]
    if isinstance(parts.allocator, PerQueryAllocator):
        caps = np.minimum(caps, baselines.per_problem_budgets(budget, len(problems))).tolist()
    queries = [
        Query(id=p.id, request=SamplingRequest("completion", "replay", prompt=p.question, query_id=p.id),
              cap=int(c), reference=p.gold, known_keys=keys.known(i, p) if keys is not None else None,
              tests=p.tests)
        for i, (p, c) in enumerate(zip(problems, caps, strict=True))
    ]
    engine = Engine(ReplaySource(problems, seed), max_in_flight=10**9)
    learns = parts.allocator.shared
    if isinstance(parts.allocator, PerQueryAllocator) and (parts.schedule.mode == "stream" or learns):
        # one run per query, in a seeded order, through one engine: what the policy's queries needed
        # carries over from query to query (the stream schedule's speculation), and a learning allocator
        # learns from each finished query before the next (calibrated_margin's margin), as between live requests
        runs: list[QueryRun] = [None] * len(queries)  # type: ignore[list-item]
        for i in random.Random(seed).sample(range(len(queries)), len(queries)):
            runs[i] = (await engine.run([queries[i]], parts, RunLimits(samples=caps[i]), seed=seed)).runs[0]
            if learns and runs[i].state.samples:
                parts.allocator.learn([runs[i].state])
    else:  # every query in flight at once: a query's simulated latency is its own, not a queue's
        runs = (await engine.run(queries, parts, RunLimits(samples=round(budget * len(problems))), seed=seed)).runs
    samples = np.zeros(len(problems))
    correct = np.zeros(len(problems), dtype=bool)
    covered = np.zeros(len(problems), dtype=bool)
    tokens = np.zeros(len(problems))
    steps = np.zeros(len(problems))
    cut = np.zeros(len(problems))
    for i, run in enumerate(runs):
        samples[i] = run.state.spent
        tokens[i] = run.usage.completion_tokens
        steps[i] = run.steps
        cut[i] = sum(d.finish_reason == "cut" for d in run.draws)
        covered[i] = any(bool(d.correct) for d in run.draws)
        sel = run.selection
        correct[i] = sel is not None and bool(run.draws[sel.index].correct)
    return Outcomes(samples, correct, covered, tokens, steps, cut)


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
    costs: list[dict[str, float]] = field(default_factory=list)
    """Per budget: ``tokens`` (mean completion tokens per problem), ``steps_p50``/``steps_p90``
    (simulated latency per problem in token steps, see :attr:`app.engine.QueryRun.steps`) and ``cut``
    (mean samples per problem a trace monitor stopped mid-way, ``deepconf``; they are among the samples)."""
    has_tokens: bool = True
    """Whether every problem records its samples' ``tokens`` (else every token figure is unknown, not 0)."""
    reach: dict[str, Any] | None = None
    """Tokens to reach majority@k accuracy (:func:`tokens_to_reach`); None without tokens."""
    code_stats: dict[str, float] = field(default_factory=dict)
    """Code problems only: ``problems``, ``programs`` (distinct programs tested), ``test_runs`` and
    ``behaviour_runs`` (sandbox processes), ``sandbox_s`` (their wall seconds, summed), ``tests_s`` and
    ``keys_s`` (wall time of the up-front tests and answer keys), ``concurrency`` (programs at once),
    ``sandbox_errors``, ``recorded_mismatch`` (recorded ``correct`` flags the execution contradicts)."""

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
            "answer_keys": self.key_stats, "timings": self.timings, "code": self.code_stats or None,
            "schedule": self.policy.spec.schedule.mode if self.policy.spec.schedule else "rounds",
            "costs": self.costs if self.has_tokens else None, "has_tokens": self.has_tokens,
            "reach": self.reach,
        }


REACH_K = 16
REACH_TOLERANCE = 0.005


def tokens_to_reach(rows: Sequence[Row], reference: Row, k: int) -> dict[str, Any] | None:
    """The fewest tokens per problem at which the policy reaches the accuracy of a majority vote of
    ``k`` samples (``reference``: uniform at budget ``k``), within :data:`REACH_TOLERANCE`:
    ``{"k", "accuracy", "majority_tokens", "budget", "tokens", "ratio"}`` (``budget``, ``tokens`` and
    ``ratio`` = tokens / majority_tokens are None where no row reaches it); None without tokens."""
    if reference.tokens is None:
        return None
    hits = [r for r in rows if r.tokens is not None and r.accuracy >= reference.accuracy - REACH_TOLERANCE]
    best = min(hits, key=lambda r: r.tokens or 0.0) if hits else None
    return {"k": k, "accuracy": reference.accuracy, "majority_tokens": reference.tokens,
            "budget": None if best is None else best.budget, "tokens": None if best is None else best.tokens,
            "ratio": None if best is None or not reference.tokens else (best.tokens or 0.0) / reference.tokens}


def cost_summary(o: Outcomes) -> dict[str, float]:
    """Mean tokens per problem, the p50/p90 of per-problem latency (token steps) and mean samples cut
    per problem, over seeds."""
    assert o.tokens is not None and o.steps is not None and o.cut is not None
    return {"tokens": float(o.tokens.mean()), "steps_p50": float(np.percentile(o.steps, 50)),
            "steps_p90": float(np.percentile(o.steps, 90)), "cut": float(o.cut.mean())}


def default_answer(problems: Sequence[Problem]) -> AnswerSpec | None:
    """The answer kind a file implies: ``code`` when every problem carries tests, else ``None`` (auto)."""
    if problems and all(p.tests is not None for p in problems):
        return AnswerSpec(kind="code")
    return None


_NEEDS: dict[str, tuple[str, Callable[[Problem], bool]]] = {
    "scores": ("a 'scores' list", lambda p: p.scores is not None),
    "likelihood": ("'logprobs' and 'tokens' lists",
                   lambda p: p.logprobs is not None and p.tokens is not None and None not in p.logprobs),
    "code_tests": ("'tests'", lambda p: p.tests is not None),
}
"""What each replay verifier needs on every problem."""


def _check_inputs(problems: Sequence[Problem], policy: ReplayPolicy) -> ReplayPolicy:
    """Raise :class:`ReplayConfigError` when the verifier, or a trace-monitoring allocator
    (``deepconf``: token-confidence traces over its ``top_k``), lacks its data; returns the policy (scores:
    with the file's logit rule)."""
    if policy.verifier in _NEEDS:
        what, has = _NEEDS[policy.verifier]
        missing = [p.id for p in problems if not has(p)]
        if missing:
            raise ReplayConfigError(
                f"--verifier {policy.verifier} needs {what} on every problem; {len(missing)} problem(s) lack "
                f"it (first: {missing[0]!r})")
    if policy.spec.probe is not None:
        raise ReplayConfigError(f"policy {policy.name!r} probes running thoughts, and recorded samples carry no "
                                "probed answers: measure it live (ttc loadtest)")
    monitor = build_parts(policy.spec, random.Random(0)).allocator.trace_monitor()
    if monitor is not None:
        for p in problems:
            try:
                check_traces(p, monitor[1])
            except ReplayFormatError as exc:
                raise ReplayConfigError(f"policy {policy.name!r}: {exc}") from None
    if policy.verifier == "scores":
        policy = dataclasses.replace(policy, score_logits=scores_are_logits(problems))
    return policy


def _sandbox_ready(runner: CodeRunner) -> None:
    try:
        runner.sandbox.check()
    except SandboxUnavailable as exc:
        raise ReplayConfigError(f"the problems carry tests, and their programs run in the sandbox: {exc}") from None


def evaluate(
    problems: Sequence[Problem], policy: ReplayPolicy, budgets: Sequence[float], seeds: int, *,
    cap: int | None = None, resamples: int = 1000, on_run: Callable[[], None] | None = None,
    workers: int | None = None, code: CodeRunner | None = None,
) -> Report:
    """Run ``policy`` at every budget for seeds ``0..seeds-1`` and compute the reference curves.
    Answer keys are computed once, up front, with ``workers`` processes (default: one per core); the
    programs of code problems are executed once, up front, by ``code`` (default :func:`code_runner`),
    and their outcomes replace the problems' ``correct`` flags (module doc). Raises
    :class:`ReplayConfigError` (a missing sandbox included)."""
    if not budgets or any(b <= 0 for b in budgets):
        raise ReplayConfigError("budgets must be positive numbers")
    if seeds < 1:
        raise ReplayConfigError("seeds must be >= 1")
    policy = _check_inputs(problems, policy)
    n_code = sum(p.tests is not None for p in problems)
    runner = (code or code_runner()) if n_code else None
    counters = (0, 0, 0.0)
    if runner is not None:
        _sandbox_ready(runner)
        counters = (runner.test_runs, runner.behaviour_runs, runner.sandbox_s)
    t0, c0 = time.perf_counter(), time.process_time()
    seed_list = list(range(seeds))
    outcomes: list[Outcomes] = []
    keys = ReplayKeys([])
    results: CodeResults | None = None
    timings: dict[str, float] = {}

    async def run_all() -> None:
        nonlocal keys, problems, results
        if runner is not None:
            t_exec = time.perf_counter()
            results = await execute_programs(problems, runner)
            problems = [dataclasses.replace(p, correct=results.correct(p)) if p.tests is not None else p
                        for p in problems]
            timings["execute_s"] = time.perf_counter() - t_exec
        t_keys = time.perf_counter()
        pool = ParsePool(workers or os.cpu_count() or 1, max_pending=len(problems) + 1)
        try:
            keys = await compute_keys(problems, policy.answer, pool, code=runner)
        finally:
            pool.close()
        timings["keys_s"] = time.perf_counter() - t_keys
        t_runs = time.perf_counter()
        for b in budgets:
            runs = []
            for s in seed_list:
                runs.append(await run_once(problems, policy, b, s, cap, keys, results))
                if on_run is not None:
                    on_run()
            outcomes.append(Outcomes(*(np.stack([getattr(r, f) for r in runs])
                                       for f in ("samples", "correct", "covered", "tokens", "steps", "cut"))))
        timings["runs_s"] = time.perf_counter() - t_runs

    original = list(problems)
    try:
        asyncio.run(run_all())
    except SandboxUnavailable as exc:  # the check passed, then the sandbox went away
        raise ReplayConfigError(f"the sandbox stopped working: {exc}") from None
    t_policy = time.perf_counter() - t0
    sh = baselines.shuffle(problems, seed_list, cap, keys.keys)
    table = baselines.uniform_table(sh)
    costs = baselines.first_correct(sh)
    boot = Bootstrap(len(problems), resamples)
    xs, ys = table.curve()
    recorded = sh.tokens is not None
    rows = [boot.row(b, o, recorded) for b, o in zip(budgets, outcomes, strict=True)]
    spend = [cost_summary(o) for o in outcomes]
    report = Report(
        policy=policy, data="", n_problems=len(problems), seeds=seeds, cap=cap, rows=rows,
        uniform=[boot.row(b, table.at(b)) for b in budgets],
        oracle=[boot.row(b, baselines.oracle(costs, b, table.spent)) for b in budgets],
        efficiency=efficiency(rows, xs, ys), uniform_curve=(xs.tolist(), ys.tolist()),
        pass_at_1=baselines.pass_at_1(sh), majority_at_k=float(ys[-1]), k=len(xs) - 1,
        per_query=is_per_query(policy), costs=spend, has_tokens=recorded,
    )
    k = min(REACH_K, int(sh.caps.max(initial=0)))
    if recorded and k > 0:
        report.reach = tokens_to_reach(rows, boot.row(float(k), table.at(k)), k)
    report.wall_s = time.perf_counter() - t0
    report.timings = {"policy_s": t_policy, "baselines_s": report.wall_s - t_policy,
                      "cpu_s": time.process_time() - c0, **timings}
    report.key_stats = {"pooled": keys.pooled, "fallbacks": keys.fallbacks}
    if runner is not None and results is not None:
        report.key_stats |= {"behaviour": keys.behaviour, "code_fallbacks": keys.code_fallbacks}
        report.code_stats = code_stats(original, problems, results, timings, since=counters)
    return report
