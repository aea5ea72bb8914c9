"""``ttc bench latency``: a fixed-size vote against the adaptive policies, side by side in one run.

Fewer tokens are a saving only when they also come sooner and let the engine serve more requests, so
this measures, against the same service and engine and on the same problems:

* for every closed-loop level, the **baseline** (one fixed ``n=k`` call) and every adaptive policy,
  interleaved in ``slices`` rounds of ``duration / slices`` seconds each (a policy's rounds are
  pooled), so all of them see the same machine; within a round every policy gets the same problems,
  and each round starts further down the list;
* per policy and level: requests per second, p50 / p90 latency, samples and tokens per query (the
  service's ``usage`` and, with backend metrics, vLLM's own ``vllm:generation_tokens_total``),
  accuracy with a bootstrap interval, failures;
* the ratios of each policy over the baseline at the same level: ``p50 / p50_base``, ``p90 /
  p90_base``, ``rps / rps_base`` and ``tokens / tokens_base`` (vLLM's counter where measured), and the
  verdicts of the suite's targets.

A :class:`Suite` names the defaults: ``arith`` (the demo model: ``self-consistency-8`` against every
built-in adaptive policy at 4 and 32 clients, :data:`TARGETS`) and ``thinker`` (the thinking model:
``self-consistency-16`` against the reasoning policies at 4 clients, :data:`THINKER_TARGETS`).

Without ``--url`` it starts ``ttc serve`` the way ``make serve`` does (the embedded engines, on free
ports it then knows, so vLLM's counters are read without being asked for) and stops it at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, get_args

from rich.console import Console
from rich.table import Table

from app.protocol import Priority
from ttc_tools.bench.procs import Endpoint, free_port, process, ttc_exe
from ttc_tools.loadtest.data import Problem
from ttc_tools.loadtest.records import RequestRecord
from ttc_tools.loadtest.runner import LevelSpec
from ttc_tools.loadtest.session import refuse_unknown_names, run_session
from ttc_tools.loadtest.stats import LevelSummary, summarize

ADAPTIVE = ("default", "confident", "adaptive", "esc", "deepconf")
"""The built-in adaptive policies of the demo model (each against the baseline)."""


@dataclass(frozen=True)
class Target:
    """One target of the engine-side monitor issue: at ``clients``, ``policy`` (``*``: every one)
    must have ``ratio`` (a :class:`Row` field) at most ``at_most`` / at least ``at_least``."""

    policy: str
    clients: int
    ratio: str
    at_most: float | None = None
    at_least: float | None = None

    def verdict(self, row: Row) -> tuple[bool, str]:
        value = getattr(row, self.ratio)
        if value is None:
            return False, f"{row.policy} @{row.clients}: {self.ratio} not measured"
        ok = (self.at_most is None or value <= self.at_most) and (self.at_least is None or value >= self.at_least)
        shown, unit = (f"{value:+.3f}", "") if self.ratio == "accuracy_delta" else (f"{value:.2f}x", "x")
        bound = f"<= {self.at_most:g}{unit}" if self.at_most is not None else f">= {self.at_least:g}{unit}"
        return ok, f"{row.policy} @{row.clients} clients: {self.ratio} {shown} (target {bound})"


TARGETS = (
    Target("confident", 4, "p50_ratio", at_most=1.1),
    Target("confident", 4, "tokens_ratio", at_most=0.8),
    Target("confident", 4, "accuracy_delta", at_least=0.0),
    Target("*", 32, "rps_ratio", at_least=1.0),
)
"""The demo model's targets: at 4 clients ``confident`` answers within 1.1x the baseline's p50 with at
most 0.8x its tokens and no lower accuracy; at 32 clients every policy serves at least its req/s."""

THINKER_TARGETS = (
    Target("calibrated", 4, "p50_ratio", at_most=1.0),
    Target("calibrated", 4, "accuracy_delta", at_least=0.0),
    Target("calibrated@tokens", 4, "tokens_paired", at_most=0.48),
)
"""The thinking model's targets: the reasoning policy that stops early (``calibrated``: a query ends
once its likelihood-weighted margin clears the learned one) answers no later than 16 samples' one
``n=16`` call at p50, at no lower accuracy; with ``ttc.priority: "tokens"`` it spends within 10 points
of what the replay says it saves (``ttc replay --data data/demo-thinking-n16.jsonl --policy calibrated
--budgets 16 --seeds 10``: 0.38x majority@16's tokens, so at most 0.48x, over the same problems)."""

PRIORITIES: tuple[str, ...] = get_args(Priority)
"""What ``NAME@PRIORITY`` in ``--policies`` may name: the ``ttc.priority`` sent with that policy."""


def ttc_for(label: str, value: Any, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``ttc`` object of a lineup entry: ``base`` (``--priority``) with ``policy: value``; a named
    policy labelled ``NAME@latency`` or ``NAME@tokens`` sends ``NAME`` with that ``priority`` (so one run
    can measure a policy under both)."""
    name, sep, priority = label.rpartition("@")
    if sep and name and priority in PRIORITIES and value == label:
        return {**(base or {}), "policy": name, "priority": priority}
    return {**(base or {}), "policy": value}


@dataclass(frozen=True)
class Suite:
    """What ``ttc bench latency --suite NAME`` measures unless told otherwise: ``policies`` against
    ``baseline`` (a built-in, or one of ``specs``: inline policies by label) on ``model`` (``None``:
    the service's default) with the problems of ``data`` (a file of the repository's ``data/``), at
    ``levels`` clients for ``duration_s`` seconds each, judged by ``targets``."""

    model: str | None
    data: str
    baseline: str
    policies: tuple[str, ...]
    levels: tuple[int, ...]
    duration_s: float
    targets: tuple[Target, ...]
    specs: Mapping[str, Any] = field(default_factory=dict)


SUITES: Mapping[str, Suite] = {
    "arith": Suite(None, "demo-arith-n64.jsonl", "self-consistency-8", ADAPTIVE, (4, 32), 60.0, TARGETS),
    # a thinking query is ~9,000 tokens of 16 traces: 4 clients get ~0.3 req/s on 2 cores, hence 4 min a policy
    "thinker": Suite("arith-thinker", "demo-thinking-n16.jsonl", "self-consistency-16",
                     ("calibrated", "calibrated@tokens", "deepconf"), (4,), 240.0, THINKER_TARGETS,
                     {"self-consistency-16": {"allocator": "fixed", "params": {"n": 16}, "aggregator": "majority"}}),
}


@dataclass
class Row:
    """One policy at one level, with its ratios over the baseline at that level (``None`` for the
    baseline's own row and where a side was not measured)."""

    policy: str
    clients: int
    requests: int
    failed: int
    rps: float
    p50_s: float
    p90_s: float
    samples: float
    service_tokens: float
    vllm_tokens: float | None
    accuracy: float | None
    accuracy_ci: tuple[float, float] | None
    p50_ratio: float | None = None
    p90_ratio: float | None = None
    rps_ratio: float | None = None
    tokens_ratio: float | None = None
    accuracy_delta: float | None = None
    tokens_paired: float | None = None
    """Tokens over the baseline's on the problems both answered (:func:`paired_tokens_ratio`)."""

    @classmethod
    def of(cls, s: LevelSummary) -> Row:
        scored = s.ok > 0 and s.scored > 0
        return cls(s.policy, int(s.load), s.requests, s.failed, s.throughput_rps, s.latency_p50_ms / 1000,
                   s.latency_p90_ms / 1000, s.samples_per_query, s.tokens_per_query, s.backend_tokens_per_query,
                   s.accuracy if scored else None, (s.accuracy_ci_low, s.accuracy_ci_high) if scored else None)

    def against(self, base: Row) -> None:
        """Fill the ratios over ``base`` (the baseline at the same level)."""
        def ratio(a: float | None, b: float | None) -> float | None:
            return None if a is None or not b else a / b

        self.p50_ratio = ratio(self.p50_s, base.p50_s)
        self.p90_ratio = ratio(self.p90_s, base.p90_s)
        self.rps_ratio = ratio(self.rps, base.rps)
        mine = self.vllm_tokens if self.vllm_tokens is not None and base.vllm_tokens is not None else \
            self.service_tokens
        theirs = base.vllm_tokens if self.vllm_tokens is not None and base.vllm_tokens is not None else \
            base.service_tokens
        self.tokens_ratio = ratio(mine, theirs)
        if self.accuracy is not None and base.accuracy is not None:
            self.accuracy_delta = self.accuracy - base.accuracy


def lineup(suite: Suite, baseline: str | None, given: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """``(label, ttc.policy value)`` of every policy measured, the baseline first (``None``: the suite's):
    ``given`` (``--policies`` and ``--policy-spec``, each label once) where a label the suite defines
    inline (its ``specs``) is that spec unless ``given`` has a spec of its own under that label."""
    base = baseline or suite.baseline
    specs = {**suite.specs, **{n: v for n, v in given if v != n}}
    return [(base, specs.get(base, base))] + [(n, specs.get(n, v)) for n, v in given if n != base]


def plan(policies: Sequence[tuple[str, Any]], levels: Sequence[int], slices: int, problems: Sequence[Problem],
         base: LevelSpec) -> list[tuple[LevelSpec, list[Problem]]]:
    """Every (level, round, policy) run in order: per level, ``slices`` rounds of every policy, each
    round on the problem list rotated further (the same rotation for every policy of a round)."""
    seconds = (base.duration_s or 0) / slices
    step = max(1, len(problems) // slices)
    out = []
    for clients in levels:
        for r in range(slices):
            turn = list(problems[r * step:]) + list(problems[:r * step])
            for name, value in policies:
                spec = LevelSpec(**{**asdict(base), "policy": name, "load": float(clients), "duration_s": seconds,
                                    "ttc": ttc_for(name, value, base.ttc)})
                out.append((spec, turn))
    return out


async def measure(url: str, policies: Sequence[tuple[str, Any]], levels: Sequence[int], *, duration_s: float,
                  slices: int, problems: Sequence[Problem], backend_metrics: Sequence[str], model: str | None,
                  temperature: float | None, timeout_s: float, console: Console,
                  priority: str | None = None) -> list[Row]:
    """Run :func:`plan` and pool each policy's rounds into one :class:`Row` per level (module doc).
    ``policies``: ``(label, ttc.policy value)``, the baseline first; ``priority``: ``ttc.priority`` of
    every request (``None``: the service's default)."""
    base = LevelSpec(url=url, policy="", mode="closed", load=1, duration_s=duration_s, model=model,
                     temperature=temperature, timeout_s=timeout_s,
                     ttc={"priority": priority} if priority else None)
    records: dict[tuple[str, int], list[RequestRecord]] = {}
    elapsed: dict[tuple[str, int], float] = {}
    generated: dict[tuple[str, int], float] = {}
    planned = plan(policies, levels, slices, problems, base)
    await refuse_unknown_names([spec for spec, _ in planned])  # before the first slice, not at its own
    for spec, turn in planned:
        result = await run_session([spec], turn, console=console, backend_metrics=backend_metrics,
                                   check_names=False)
        key = (spec.policy, int(spec.load))
        records.setdefault(key, []).extend(result.records)
        elapsed[key] = elapsed.get(key, 0.0) + result.summaries[0].elapsed_s
        per_query = result.summaries[0].backend_tokens_per_query
        if per_query is not None:
            generated[key] = generated.get(key, 0.0) + per_query * len(result.records)
    rows = []
    for (name, clients), recs in records.items():
        summary = summarize(recs, policy=name, mode="closed", load=clients, elapsed_s=elapsed[(name, clients)])
        if (name, clients) in generated and recs:
            summary.backend_tokens_per_query = generated[(name, clients)] / len(recs)
        rows.append(Row.of(summary))
    baseline = policies[0][0]
    by_level = {r.clients: r for r in rows if r.policy == baseline}
    for row in rows:
        if row.policy != baseline and row.clients in by_level:
            row.against(by_level[row.clients])
            row.tokens_paired = paired_tokens_ratio(records[(row.policy, row.clients)],
                                                    records[(baseline, row.clients)])
    return rows


def paired_tokens_ratio(mine: Sequence[RequestRecord], base: Sequence[RequestRecord]) -> float | None:
    """``sum_p m(p) / sum_p b(p)`` over the problems ``p`` both sides answered, ``m(p)`` and ``b(p)`` the
    mean completion tokens of their successful requests for ``p`` (the service's count; vLLM's counter
    is per slice, not per request). Why: closed-loop clients finish fewer requests of a slower policy,
    so each side's per-query mean is over a different head of the problem list; paired, the ratio is
    over the same problems. ``None`` when they share none."""
    def means(records: Sequence[RequestRecord]) -> dict[str, float]:
        seen: dict[str, list[int]] = {}
        for r in records:
            if r.error is None and r.completion_tokens is not None:
                seen.setdefault(r.problem_id, []).append(r.completion_tokens)
        return {p: sum(v) / len(v) for p, v in seen.items()}

    m, b = means(mine), means(base)
    common = m.keys() & b.keys()
    theirs = sum(b[p] for p in common)
    return sum(m[p] for p in common) / theirs if common and theirs > 0 else None


def verdicts(rows: Sequence[Row], baseline: str, targets: Sequence[Target]) -> list[tuple[bool, str]]:
    """Each target against the rows it concerns (``*``: every policy but the baseline)."""
    out = []
    for t in targets:
        for row in rows:
            if row.clients == t.clients and row.policy != baseline and t.policy in ("*", row.policy):
                out.append(t.verdict(row))
    return out


def table(rows: Sequence[Row], title: str) -> Table:
    view = Table(title=title)
    for col in ("policy", "clients", "req", "fail", "req/s", "x rps", "p50 s", "x p50", "p90 s", "x p90",
                "samples/q", "tok/q svc", "tok/q vLLM", "x tok", "x tok paired", "accuracy [95% CI]"):
        view.add_column(col, justify="right", no_wrap=True)

    def x(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    for r in rows:
        acc = "-" if r.accuracy is None or r.accuracy_ci is None else \
            f"{r.accuracy:.3f} [{r.accuracy_ci[0]:.3f}, {r.accuracy_ci[1]:.3f}]"
        view.add_row(r.policy, str(r.clients), str(r.requests), str(r.failed), f"{r.rps:.2f}", x(r.rps_ratio),
                     f"{r.p50_s:.2f}", x(r.p50_ratio), f"{r.p90_s:.2f}", x(r.p90_ratio), f"{r.samples:.2f}",
                     f"{r.service_tokens:.0f}", "-" if r.vllm_tokens is None else f"{r.vllm_tokens:.0f}",
                     x(r.tokens_ratio), x(r.tokens_paired), acc)
    return view


@contextlib.contextmanager
def embedded_service(log_dir: Path) -> Iterator[tuple[Endpoint, list[str]]]:
    """``ttc serve`` as ``make serve`` starts it (the embedded engines), every engine on a known free
    port; yields the service URL and the generators' vLLM URLs (for their counters)."""
    from app.config import bundled_engines

    engine_port = free_port()
    extra = [e.model_copy(update={"port": free_port()}) for e in bundled_engines()]
    env = {"TTC_ENGINE__PORT": str(engine_port),
           "TTC_EXTRA_ENGINES": json.dumps([e.model_dump(mode="json") for e in extra])}
    generators = [f"http://127.0.0.1:{engine_port}"] + [
        f"http://127.0.0.1:{e.port}" for e in extra if e.role == "generate" and (e.model_dir / "config.json").exists()]
    port = free_port()
    url = Endpoint(f"http://127.0.0.1:{port}")
    log_dir.mkdir(parents=True, exist_ok=True)
    with process([ttc_exe(), "serve", "--port", str(port), "--log-level", "warning"], url + "/ready", timeout=900,
                 env=env, log=log_dir / "bench-latency-service.log") as proc:
        url.pid = proc.pid
        yield url, generators


def write_json(path: Path, rows: Sequence[Row], meta: dict[str, Any]) -> None:
    path.write_text(json.dumps({**meta, "rows": [asdict(r) for r in rows]}, indent=2) + "\n")


def run(url: str | None, policies: Sequence[tuple[str, Any]], levels: Sequence[int], *, duration_s: float, slices: int,
        problems: Sequence[Problem], backend_metrics: Sequence[str], model: str | None, temperature: float | None,
        timeout_s: float, console: Console, log_dir: Path = Path(".logs"), priority: str | None = None) -> list[Row]:
    """:func:`measure` against ``url``, or against a service started here (:func:`embedded_service`)."""
    with contextlib.ExitStack() as stack:
        if url is None:
            console.print("starting ttc serve with the embedded engines (a minute or two) ...")
            url, found = stack.enter_context(embedded_service(log_dir))
            backend_metrics = [*backend_metrics, *found]
        return asyncio.run(measure(url, policies, levels, duration_s=duration_s, slices=slices, problems=problems,
                                   backend_metrics=backend_metrics, model=model, temperature=temperature,
                                   timeout_s=timeout_s, console=console, priority=priority))
