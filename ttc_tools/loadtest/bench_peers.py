"""``ttc bench peers``: this service against peer proxies on the same 8-sample majority vote.

Systems, all sending chat requests for the same problems to the same backend:

* ``direct``: the backend itself, one call with ``n=8`` (no vote): the ceiling of any proxy;
* ``ttc``: this service with ``ttc.policy = "self-consistency-8"`` (one call with ``n=8``, vote);
* each peer of :mod:`ttc_tools.loadtest.peers` that installs and starts.

For every closed-loop level (default 1, 16, 64 clients) the systems run in ``slices`` rounds of
``duration_s / slices`` seconds each, the order rotated every round, so that all of them see the
same machine conditions (interleaved); a system's records and elapsed time are pooled over its
slices. Reported per system × level: throughput, p50/p99 latency, accuracy; per peer the ratio
``ttc_rps / peer_rps`` (target ≥ 3 at 64 clients on the fake backend) and, for every proxy, its
added latency over ``direct`` (``p50 - direct_p50``, ``p99 - direct_p99``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ttc_tools.bench.procs import Endpoint, cpu_seconds
from ttc_tools.loadtest.data import Problem
from ttc_tools.loadtest.peers import SAMPLES, Peer, PeerError, ensure_installed, running_peer
from ttc_tools.loadtest.records import RequestRecord
from ttc_tools.loadtest.runner import LevelSpec, run_level
from ttc_tools.loadtest.scoring import score_records
from ttc_tools.loadtest.stats import LevelSummary, summarize


@dataclass(frozen=True)
class System:
    """One system under load; ``pid``: its process, whose CPU time is accounted per request."""

    name: str
    url: str
    ttc: dict[str, Any] | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)
    pid: int | None = None


def synthetic_problems(n: int = 200, seed: int = 0) -> list[Problem]:
    """Problems for the fake backend, which answers the last integer of the prompt (w.p. p_correct)."""
    rng = random.Random(seed)
    return [Problem(f"syn-{i}", f"Problem {i}: report the number {x}.", str(x))
            for i, x in ((i, rng.randint(10, 9999)) for i in range(n))]


def demo_problems(n_per_level: int = 20, seed: int = 0) -> list[Problem]:
    """Arithmetic problems the bundled demo model was trained on (for the vLLM backend)."""
    from ttc_tools.demo.problems import make_set

    return [Problem(f"demo-{i}", p.question, str(p.gold))
            for i, p in enumerate(make_set(n_per_level, seed=seed))]


@dataclass
class PeersReport:
    """``cpu_ms[(system, clients)]``: the system process's CPU milliseconds per answered request."""

    target: str
    summaries: list[LevelSummary]
    skipped: dict[str, str]
    cpu_ms: dict[tuple[str, int], float] = field(default_factory=dict)

    def rows(self) -> list[dict[str, Any]]:
        """One row per system × level with the ratios and overheads described in the module doc."""
        by = {(s.policy, s.load): s for s in self.summaries}
        rows = []
        for s in self.summaries:
            ttc = by.get(("ttc", s.load))
            direct = by.get(("direct", s.load))
            row = {"target": self.target, "system": s.policy, "clients": int(s.load),
                   "requests": s.requests, "failed": s.failed, "rps": s.throughput_rps,
                   "p50_ms": s.latency_p50_ms, "p99_ms": s.latency_p99_ms, "accuracy": s.accuracy,
                   "ttc_rps_ratio": (ttc.throughput_rps / s.throughput_rps
                                     if ttc and s.throughput_rps > 0 and s.policy not in ("ttc", "direct")
                                     else None),
                   "added_p50_ms": s.latency_p50_ms - direct.latency_p50_ms
                   if direct and s.policy != "direct" else None,
                   "added_p99_ms": s.latency_p99_ms - direct.latency_p99_ms
                   if direct and s.policy != "direct" else None,
                   "cpu_ms_per_req": self.cpu_ms.get((s.policy, int(s.load))),
                   "errors": s.errors}
            rows.append(row)
        return rows


def verdicts(report: PeersReport, *, target_ratio: float | None = 3.0) -> list[str]:
    """Plain-language results at the highest load level: this service's throughput over each peer's
    (against ``target_ratio`` when given: the proxies' ceiling is measured on the fake backend; on a
    real engine the yardstick is the backend's own throughput) and over ``direct`` (the ceiling)."""
    if not report.summaries:
        return []
    top = max(s.load for s in report.summaries)
    by = {s.policy: s for s in report.summaries if s.load == top}
    ttc = by.get("ttc")
    if ttc is None:
        return []
    lines = []
    for name, s in by.items():
        if name in ("ttc", "direct"):
            continue
        ratio = ttc.throughput_rps / s.throughput_rps if s.throughput_rps > 0 else float("inf")
        verdict = ""
        if target_ratio is not None:
            verdict = f" (target >= {target_ratio:g}x: {'met' if ratio >= target_ratio else 'NOT met'})"
        lines.append(f"{report.target}, {int(top)} clients: ttc {ttc.throughput_rps:.1f} req/s vs {name} "
                     f"{s.throughput_rps:.1f} req/s = {ratio:.2f}x{verdict}")
    direct = by.get("direct")
    if direct is not None and direct.throughput_rps > 0:
        share = ttc.throughput_rps / direct.throughput_rps
        verdict = f" (target >= 60%: {'met' if share >= 0.6 else 'NOT met'})" if target_ratio is not None else ""
        lines.append(f"{report.target}, {int(top)} clients: ttc reaches {share:.0%} of the backend's own "
                     f"throughput ({direct.throughput_rps:.1f} req/s with n={SAMPLES}, no vote){verdict}")
    if target_ratio is not None:
        lines += overhead_verdicts(report)
    return lines


def overhead_verdicts(report: PeersReport, clients: int = 16) -> list[str]:
    """The service's overhead targets: at ``clients`` clients p50 <= direct + 2 ms and p99 <= direct
    + 10 ms; at every level CPU <= 0.6 ms per 8-sample request."""
    by = {(s.policy, int(s.load)): s for s in report.summaries}
    lines = []
    ttc, direct = by.get(("ttc", clients)), by.get(("direct", clients))
    if ttc is not None and direct is not None:
        d50, d99 = ttc.latency_p50_ms - direct.latency_p50_ms, ttc.latency_p99_ms - direct.latency_p99_ms
        lines.append(f"{report.target}, {clients} clients: added p50 {d50:+.1f} ms (target <= 2: "
                     f"{'met' if d50 <= 2 else 'NOT met'}), added p99 {d99:+.1f} ms (target <= 10: "
                     f"{'met' if d99 <= 10 else 'NOT met'})")
    for (name, load), ms in sorted(report.cpu_ms.items()):
        if name == "ttc":
            lines.append(f"{report.target}, {load} clients: service CPU {ms:.2f} ms per request (target <= 0.6: "
                         f"{'met' if ms <= 0.6 else 'NOT met'})")
    return lines


def peers_table(report: PeersReport) -> Table:
    table = Table(title=f"Peers, {SAMPLES}-sample majority vote, backend: {report.target}")
    cols = ("system", "clients", "requests", "failed", "rps", "p50_ms", "p99_ms", "accuracy",
            "ttc_rps_ratio", "added_p50_ms", "added_p99_ms", "cpu_ms_per_req", "errors")
    for c in cols:
        table.add_column(c.replace("_ms", " ms").replace("ttc_rps_ratio", "ttc÷this rps"),
                         justify="left" if c in ("system", "errors") else "right")
    for row in report.rows():
        cells = []
        for c in cols:
            v = row[c]
            if v is None:
                cells.append("-")
            elif isinstance(v, dict):
                cells.append(", ".join(f"{k}={n}" for k, n in v.items()) or "-")
            elif isinstance(v, float):
                cells.append(f"{v:.2f}" if c in ("accuracy", "ttc_rps_ratio", "cpu_ms_per_req") else f"{v:.1f}")
            else:
                cells.append(str(v))
        table.add_row(*cells)
    return table


async def compare(systems: Sequence[System], problems: Sequence[Problem], *, target: str, model: str,
                  levels: Sequence[int], duration_s: float, slices: int, max_tokens: int | None,
                  timeout_s: float, console: Console,
                  cpu_ms: dict[tuple[str, int], float] | None = None) -> list[LevelSummary]:
    """Run every system at every level, interleaved in slices (see the module docstring); fills
    ``cpu_ms`` with each system's CPU milliseconds per answered request (systems with a ``pid``)."""
    summaries: list[LevelSummary] = []
    for level in levels:
        pooled: dict[str, list[RequestRecord]] = {s.name: [] for s in systems}
        elapsed: dict[str, float] = dict.fromkeys(pooled, 0.0)
        cpu: dict[str, float] = dict.fromkeys(pooled, 0.0)
        for k in range(slices):
            order = list(systems[k % len(systems):]) + list(systems[:k % len(systems)])
            for system in order:
                spec = LevelSpec(url=system.url, policy=system.name, mode="closed", load=level,
                                 duration_s=duration_s / slices, timeout_s=timeout_s, model=model,
                                 ttc=system.ttc, max_tokens=max_tokens, temperature=0.7,
                                 extra_body=system.extra_body, seed=k)
                before = cpu_seconds(system.pid) if system.pid else 0.0
                result = await run_level(spec, problems)
                if system.pid:
                    cpu[system.name] += cpu_seconds(system.pid) - before
                pooled[system.name].extend(result.records)
                elapsed[system.name] += result.elapsed_s
                ok = sum(r.error is None for r in result.records)
                console.print(f"  {target} · {level:>3} clients · slice {k + 1}/{slices} · "
                              f"{system.name:<8} {ok / max(result.elapsed_s, 1e-9):8.1f} req/s, "
                              f"{len(result.records) - ok} failed")
        for system in systems:
            recs = pooled[system.name]
            ok = sum(r.error is None for r in recs)
            if system.pid and ok and cpu_ms is not None:
                cpu_ms[(system.name, level)] = cpu[system.name] * 1000 / ok
            await asyncio.to_thread(score_records, recs, timeout_s=60)
            summaries.append(summarize(recs, policy=system.name, mode="closed", load=level,
                                       elapsed_s=elapsed[system.name]))
    return summaries


def run_target(target: str, backend: str, service: Endpoint, peers: Sequence[Peer], *, model: str,
               problems: Sequence[Problem], levels: Sequence[int], duration_s: float, slices: int,
               max_tokens: int | None, timeout_s: float, log_dir: Path, install: bool,
               console: Console, cpus: set[int] | None = None) -> PeersReport:
    """Start the peers against ``backend`` (on ``cpus``, the service's, when given; reporting each
    one that fails), then :func:`compare`."""
    skipped: dict[str, str] = {}
    cpu_ms: dict[tuple[str, int], float] = {}
    systems = [System("direct", backend, extra_body={"n": SAMPLES}),
               System("ttc", service, ttc={"policy": "self-consistency-8"}, pid=service.pid or None)]
    with contextlib.ExitStack() as stack:
        for peer in peers:
            try:
                ensure_installed(peer, install=install)
                url = stack.enter_context(running_peer(peer, backend, model, log_dir=log_dir, cpus=cpus))
            except PeerError as exc:
                skipped[peer.name] = str(exc)
                console.print(f"[red]{peer.name} not measured:[/] {exc}")
                continue
            console.print(f"{peer.name}: {peer.description().replace('<backend>', backend)}")
            systems.append(System(peer.name, url, extra_body=dict(peer.request_extra), pid=url.pid))
        summaries = asyncio.run(compare(systems, problems, target=target, model=model, levels=levels,
                                        duration_s=duration_s, slices=slices, max_tokens=max_tokens,
                                        timeout_s=timeout_s, console=console, cpu_ms=cpu_ms))
    return PeersReport(target, summaries, skipped, cpu_ms)
