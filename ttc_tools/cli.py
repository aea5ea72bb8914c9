"""The operator tools' commands, added to the ``ttc`` command line through the ``ttc.commands``
entry point (the service never imports this package): ``ttc fake-backend``, ``ttc loadtest``, ``ttc trace-path``,
``ttc bench overhead|answers|sandbox|peers``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from ttc_tools.loadtest.cli import PRIORITY_HELP, Priority


def fake_backend(
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8100,
    latency_ms: Annotated[float, typer.Option(help="Fixed latency of every call.")] = 50.0,
    p_correct: Annotated[float, typer.Option(help="Chance a sample carries the prompt's true answer.")] = 0.7,
    style: Annotated[str, typer.Option(help="What samples say: number | math | code | prose.")] = "number",
    token_latency_ms: Annotated[float, typer.Option(help="Streamed calls: time between tokens.")] = 0.0,
    stall_after: Annotated[int | None, typer.Option(
        help="Streamed samples after the first N send one token and then hang until the client leaves "
             "(POST /fake/stall {\"after\": null} lifts it).")] = None,
) -> None:
    """Run a fixed-latency fake OpenAI server (for demos, benchmarks and load-test practice)."""
    from ttc_tools.fakes.backend import STYLES, serve_fake

    if style not in STYLES:
        raise typer.BadParameter(f"use one of {', '.join(STYLES)}", param_hint="--style")
    serve_fake(port, latency_ms / 1000, p_correct=p_correct, style=style, token_latency_s=token_latency_ms / 1000,
               stall_after=stall_after)


def bench_overhead(
    target: Annotated[str, typer.Option(help="Comma list of backends to measure against: fake, vllm.")] = "fake,vllm",
    concurrency: Annotated[int, typer.Option(help="Concurrent clients.")] = 16,
    requests: Annotated[int, typer.Option(help="Request pairs (direct + through the service) per target.")] = 800,
    latency_ms: Annotated[float, typer.Option(help="Fixed latency of the fake backend.")] = 50.0,
    model_dir: Annotated[Path | None, typer.Option(help="Model for the vLLM target (default: demo model).")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the rows as JSON here.")] = None,
) -> None:
    """Service overhead: p50/p99 of the same requests sent directly to a backend and through the
    service, interleaved, against (a) a fixed-latency fake server and (b) the real vLLM CPU engine.
    Target: added p50 < 2 ms and p99 < 10 ms at 16 concurrent clients."""
    import asyncio

    from rich.console import Console
    from rich.table import Table

    from app.backends.launcher import EmbeddedEngine
    from app.config import EngineConfig
    from ttc_tools.bench import procs
    from ttc_tools.bench.overhead import run_overhead

    console = Console(width=160)
    rows = []
    for name in [t.strip() for t in target.split(",") if t.strip()]:
        console.print(f"[bold]{name}[/]: starting processes ...")
        if name == "fake":
            body = {"model": "fake-model", "messages": [{"role": "user", "content": "What is 2 + 2?"}],
                    "max_tokens": 16}
            with procs.fake_backend(latency_ms) as backend, procs.service([backend]) as svc:
                result = asyncio.run(run_overhead(backend, svc, body, target=f"fake {latency_ms:g} ms",
                                                  concurrency=concurrency, requests=requests))
        elif name == "vllm":
            cfg = EngineConfig() if model_dir is None else EngineConfig(model_dir=model_dir)
            engine = EmbeddedEngine(cfg, log_path=Path(".logs/bench-vllm.log"))
            engine.start()
            try:
                asyncio.run(engine.wait_ready())
                body = {"model": cfg.served_model_name, "max_tokens": 16, "temperature": 0.0,
                        "messages": [{"role": "user", "content": "What is 23 + 19?"}]}
                with procs.service([engine.url]) as svc:
                    result = asyncio.run(run_overhead(engine.url, svc, body, target="vllm-cpu",
                                                      concurrency=concurrency, requests=requests // 4))
            finally:
                engine.stop()
        else:
            raise typer.BadParameter(f"unknown target {name!r}; use fake or vllm", param_hint="--target")
        rows.append(result.row())
    table = Table(title=f"Service overhead at {concurrency} concurrent clients (latency in ms)")
    for col in ("target", "pairs", "direct p50", "direct p99", "service p50", "service p99", "added p50",
                "added p99", "errors"):
        table.add_column(col, justify="right", no_wrap=True)
    for r in rows:
        table.add_row(*(f"{r[c]:.2f}" if isinstance(r[c], float) else str(r[c]) for c in (
            "target", "requests", "direct_p50_ms", "direct_p99_ms", "service_p50_ms", "service_p99_ms",
            "added_p50_ms", "added_p99_ms", "errors")))
    console.print(table)
    if json_out:
        json_out.write_text(json.dumps(rows, indent=2))


def bench_answers(
    styles: Annotated[str, typer.Option(help="Comma list of sample styles: number, math, code, prose.")] =
        "number,math,code,prose",
    clients: Annotated[int, typer.Option(help="Concurrent closed-loop clients.", min=1)] = 16,
    duration: Annotated[float, typer.Option(help="Seconds of load per style.", min=1)] = 20.0,
    latency_ms: Annotated[float, typer.Option(help="Fixed latency of the fake backend.")] = 50.0,
    policy: Annotated[str, typer.Option(help="Policy of every request.")] = "self-consistency-8",
    service: Annotated[str | None, typer.Option(
        help="URL of a running service to load instead of starting one per style (its backend decides "
             "the style; give one style as its label).")] = None,
    pin: Annotated[bool, typer.Option(
        help="On 2+ CPUs: the service on the last CPU, this load generator and the backend on the others.")] = True,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the rows as JSON here.")] = None,
) -> None:
    """Whether sample text stalls the service: per style of sample text (fake backend), requests served
    per second and GET /health latency while CLIENTS clients load it. Target: /health p99 < 20 ms for
    every style."""
    import asyncio

    from rich.console import Console
    from rich.table import Table

    from ttc_tools.bench import procs
    from ttc_tools.bench.answers import run_answer_load
    from ttc_tools.fakes.backend import STYLES

    console = Console(width=160)
    split = procs.pinning() if pin else None
    if split is not None:
        os.sched_setaffinity(0, split[0])
    rows = []
    for style in [s.strip() for s in styles.split(",") if s.strip()]:
        if style not in STYLES:
            raise typer.BadParameter(f"unknown style {style!r}; use {', '.join(STYLES)}", param_hint="--styles")
        console.print(f"[bold]{style}[/]: {clients} clients for {duration:g} s ...")
        if service is not None:
            result = asyncio.run(run_answer_load(service, style, clients=clients, duration_s=duration, policy=policy))
        else:
            with procs.fake_backend(latency_ms, style, cpus=split[0] if split else None) as backend, \
                    procs.service([backend], cpus=split[1] if split else None) as svc:
                result = asyncio.run(run_answer_load(svc, style, clients=clients, duration_s=duration, policy=policy))
        rows.append(result.row())
    table = Table(title=f"Answer handling under load: {clients} clients, policy {policy}, fake backend "
                        f"{latency_ms:g} ms")
    cols = ("style", "served", "req_per_s", "errors", "timeouts", "health_probes", "health_p50_ms",
            "health_p99_ms", "health_max_ms")
    for col in cols:
        table.add_column(col, justify="right", no_wrap=True)
    for r in rows:
        table.add_row(*(f"{r[c]:.1f}" if isinstance(r[c], float) else str(r[c]) for c in cols))
    console.print(table)
    if json_out:
        json_out.write_text(json.dumps(rows, indent=2))


def bench_sandbox(
    programs: Annotated[str, typer.Option(help="Comma list of programs: empty, humaneval, python (the bare "
                                              "interpreter, no sandbox: the baseline).")] = "python,empty,humaneval",
    concurrency: Annotated[str, typer.Option(help="Comma list of sandbox slots (programs at once).")] = "1,2,4",
    count: Annotated[int, typer.Option(help="Distinct programs per row.", min=1)] = 100,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the rows as JSON here.")] = None,
) -> None:
    """Cost of one sandboxed program under load: COUNT distinct programs per row through the service's
    sandbox (bubblewrap, rlimits, the code_tests harness), CONCURRENCY at a time; programs/s, ms per
    program (elapsed / count), each run's own wall time, the share of the machine's CPU that was busy
    meanwhile (everyone's) and the load average. A run is a process start (about 10 ms of Python start-up
    and 10 ms of namespaces and mounts on an idle core) and its work: when the machine's CPU is busy, every
    run waits for a core, and neither more slots nor a faster program helps."""
    import asyncio

    from rich.console import Console
    from rich.table import Table

    from ttc_tools.bench.answers import run_sandbox_load

    console = Console(width=160)
    rows = []
    for program in [p.strip() for p in programs.split(",") if p.strip()]:
        if program not in ("empty", "humaneval", "python"):
            raise typer.BadParameter(f"unknown program {program!r}", param_hint="--programs")
        for c in [int(x) for x in concurrency.split(",") if x.strip()]:
            console.print(f"[bold]{program}[/]: {count} programs, {c} at a time ...")
            rows.append(asyncio.run(run_sandbox_load(program, c, count)).row())
    table = Table(title=f"Sandboxed programs under load ({os.cpu_count()} CPUs)")
    cols = ("program", "concurrency", "programs", "programs_per_s", "ms_per_program", "run_ms_p50", "run_ms_max",
            "cpu_busy_pct", "failures", "load_1m")
    for col in cols:
        table.add_column(col, justify="right", no_wrap=True)
    for r in rows:
        table.add_row(*(f"{r[c]:.1f}" if isinstance(r[c], float) else str(r[c]) for c in cols))
    console.print(table)
    if json_out:
        json_out.write_text(json.dumps(rows, indent=2))


def bench_latency(
    suite: Annotated[str, typer.Option(
        help="What is compared by default: arith (the demo model: self-consistency-8 against every built-in "
             "adaptive policy at 4 and 32 clients) or thinker (arith-thinker: self-consistency-16 against "
             "calibrated and deepconf at 4 clients, 4 min a policy). The options below override its choices.")] =
        "arith",
    url: Annotated[str | None, typer.Option(
        help="A running service (loopback) to measure; default: start `ttc serve` as `make serve` does.")] = None,
    policies: Annotated[str | None, typer.Option(
        help="Comma list of the policies compared with the baseline; NAME@tokens (or NAME@latency) sends NAME "
             "with that ttc.priority, so one run can hold a policy under both.",
        show_default="the suite's")] = None,
    baseline: Annotated[str | None, typer.Option(
        help="The fixed-size policy every ratio is over (a name, or the label of a --policy-spec).",
        show_default="the suite's: self-consistency-8 | self-consistency-16")] = None,
    policy_spec: Annotated[list[str] | None, typer.Option(
        help='An inline policy LABEL=JSON (repeatable), e.g. self-consistency-16=\'{"allocator":"fixed",'
             '"params":{"n":16},"aggregator":"majority"}\'')] = None,
    concurrency: Annotated[str | None, typer.Option(help="Closed-loop levels (clients), comma list.",
                                                    show_default="the suite's: 4,32 | 4")] = None,
    duration: Annotated[float | None, typer.Option(help="Seconds per policy and level (split into --slices rounds).",
                                                   min=1, show_default="the suite's: 60 | 240")] = None,
    slices: Annotated[int, typer.Option(help="Interleaved rounds per level.", min=1)] = 3,
    data: Annotated[Path | None, typer.Option(help="Problem set or replay file (JSONL).",
                                              show_default="the suite's, bundled: data/demo-arith-n64.jsonl | "
                                                           "data/demo-thinking-n16.jsonl")] = None,
    model: Annotated[str | None, typer.Option(
        help="Model of every request.", show_default="the suite's: the service's default | arith-thinker")] = None,
    temperature: Annotated[float, typer.Option(help="Sampling temperature of every request.")] = 1.0,
    priority: Annotated[Priority | None, typer.Option(
        help=PRIORITY_HELP, show_default="the service's: latency")] = None,
    backend_metrics: Annotated[list[str] | None, typer.Option(
        help="A vLLM server's base URL whose generation-token counter is read (repeatable; with --url).")] = None,
    timeout: Annotated[float, typer.Option(help="Per-request timeout (s).")] = 300.0,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the rows and verdicts as JSON here.")] = None,
) -> None:
    """A fixed-size vote (one n=k call) against the adaptive policies, in one run, interleaved: requests
    per second, p50/p90, samples and tokens per query (vLLM's own counter), accuracy, and each policy's
    ratios over the baseline; then the suite's targets. arith: at 4 clients `confident` p50 <= 1.1x and
    vLLM tokens <= 0.8x self-consistency-8's at no lower accuracy, at 32 clients every policy's requests
    per second >= its. thinker: `calibrated` p50 <= self-consistency-16's at no lower accuracy, and with
    ttc.priority tokens (`calibrated@tokens`) at most 0.48x its tokens on the same problems. Without
    --url it starts the service with the embedded engines itself."""
    from app.config import REPO_ROOT
    from ttc_tools.bench.latency import SUITES, lineup, run, table, verdicts, write_json
    from ttc_tools.loadtest.cli import _console, _loopback, _policies
    from ttc_tools.loadtest.data import load_problems
    from ttc_tools.loadtest.session import UnknownName

    if suite not in SUITES:
        raise typer.BadParameter(f"one of {', '.join(SUITES)}, got {suite!r}", param_hint="--suite")
    chosen = SUITES[suite]
    console = _console()
    names = lineup(chosen, baseline, _policies(policies or ",".join(chosen.policies), policy_spec or []))
    try:
        levels = [int(c) for c in concurrency.split(",") if c.strip()] if concurrency else list(chosen.levels)
    except ValueError as exc:
        raise typer.BadParameter(f"comma list of client counts, got {concurrency!r}") from exc
    if not levels or any(c < 1 for c in levels):
        raise typer.BadParameter("give at least one level of >= 1 client", param_hint="--concurrency")
    target = None if url is None else _loopback(url, "--url")
    metrics = [_loopback(u, "--backend-metrics") for u in backend_metrics or []]
    try:
        problems = load_problems(data or REPO_ROOT / "data" / chosen.data, shuffle=True, seed=0)
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--data") from exc
    seconds = duration or chosen.duration_s
    try:
        rows = run(target, names, levels, duration_s=seconds, slices=slices, problems=problems,
                   backend_metrics=metrics, model=model or chosen.model, temperature=temperature, timeout_s=timeout,
                   console=console, priority=priority)
    except UnknownName as exc:
        raise typer.BadParameter(str(exc), param_hint="--model" if exc.option == "--model" else "--policies") from exc
    base = names[0][0]
    console.print(table(rows, f"{', '.join(n for n, _ in names[1:])} against {base} (ratios over it, same level)"))
    checks = verdicts(rows, base, chosen.targets)
    for ok, line in checks:
        console.print(("[green]met[/]    " if ok else "[red]missed[/] ") + line)
    if json_out:
        write_json(json_out, rows, {"suite": suite, "baseline": base, "levels": levels, "duration_s": seconds,
                                    "slices": slices, "priority": priority,
                                    "verdicts": [{"met": ok, "what": w} for ok, w in checks]})


DEMO_PRM_URL = "embedded:arith-prm"
STANDARD = "majority:4,majority:8,majority:16,beam:8,dvts:8,particles:8"


def demo_base(prm_url: str) -> dict[str, Any]:
    """The demo's PRM settings, those of the built-in ``compute-optimal`` policy without its rule:
    arith-prm (at ``prm_url``) scores the demo model's worked lines (one step a line)."""
    from app.policy import BUILTIN_POLICIES

    builtin = BUILTIN_POLICIES["compute-optimal"]
    verifier = {**builtin["verifier"], "params": {**builtin["verifier"]["params"], "url": prm_url}}
    return {"allocator": "fixed", "aggregator": builtin["aggregator"], "verifier": verifier,
            "search": dict(builtin["search"])}


def _measure(url: str, api_key: str | None, model: str, problems: Any, policies: dict[str, Any], concurrency: int,
             what: str) -> list[Any]:
    """Every policy on every problem through the service at ``url``, with a progress bar."""
    import asyncio

    import httpx
    from rich.console import Console
    from rich.progress import Progress

    from ttc_tools.optimal import measure

    async def run() -> list[Any]:
        key = api_key or os.environ.get("TTC_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        async with httpx.AsyncClient(base_url=url, timeout=600, headers=headers) as client:
            with Progress(console=Console(stderr=True), transient=True) as bar:
                task = bar.add_task(what, total=len(problems) * len(policies))
                return await measure(client, model, problems, policies, concurrency=concurrency,
                                     progress=lambda: bar.advance(task))

    return asyncio.run(run())


def optimal_fit(
    url: Annotated[str, typer.Option(help="The running service (loopback).")] = "http://127.0.0.1:8000",
    model: Annotated[str, typer.Option(help="Model of every request.")] = "arith-llama",
    levels: Annotated[str, typer.Option(help="Demo problem levels to fit on (comma list).")] = "1,2,3,4,5",
    per_level: Annotated[int, typer.Option(help="Problems per level.", min=1)] = 20,
    seed: Annotated[int, typer.Option(help="Seed of the fitting problem set (the evaluation set uses 1234).")] = 7,
    candidates: Annotated[str, typer.Option(help="Strategies to choose from, method:width (standard: "
                                                 "majority:4,8,16, beam:8, dvts:8, particles:8).")] = "standard",
    bins: Annotated[str, typer.Option(help="Agreement thresholds of the bins, descending.")] = "0.99,0.7,0.45",
    probe: Annotated[int, typer.Option(help="Probe samples that estimate difficulty.", min=1)] = 4,
    tolerance: Annotated[float, typer.Option(help="Accuracy a cheaper choice may give up in a bin.")] = 0.02,
    base: Annotated[str | None, typer.Option(help="Base policy (JSON): verifier, aggregator, search steps; "
                                                  "default: the demo's PRM settings.")] = None,
    prm_url: Annotated[str, typer.Option(help="The PRM of the default base policy.")] = DEMO_PRM_URL,
    concurrency: Annotated[int, typer.Option(help="Requests at once.", min=1)] = 4,
    out: Annotated[Path, typer.Option(help="The fitted policy (JSON).")] = Path("optimal-policy.json"),
    results: Annotated[Path | None, typer.Option(help="Every outcome and the per-bin / per-level tables.")] = None,
    install: Annotated[str | None, typer.Option(help="Also create (or update) this policy through the API.")] = None,
    api_key: Annotated[str | None, typer.Option(help="Admin key for --install (or TTC_API_KEY).")] = None,
) -> None:
    """Fit the compute-optimal table: every candidate strategy on every problem (the same probe, so the
    same difficulty bin), then per bin the most accurate candidate or, within --tolerance of it, the
    cheapest; writes the policy (and with --install, stores it)."""
    from rich.console import Console
    from rich.table import Table

    from ttc_tools.demo.problems import make_set
    from ttc_tools.loadtest.target import require_loopback
    from ttc_tools.optimal import Problem, candidate_policies, dumps, fit, policy_for, report

    require_loopback(url)
    console = Console(stderr=True)
    base_spec = json.loads(base) if base else demo_base(prm_url)
    if candidates == "standard":
        candidates = STANDARD
    cands = [c.strip() for c in candidates.split(",") if c.strip()]
    thresholds = [float(b) for b in bins.split(",")]
    problems = [Problem(f"fit-{p.level}-{i}", p.question, str(p.gold), p.level) for i, p in
                enumerate(make_set(per_level, [int(x) for x in levels.split(",")], seed=seed))]

    policies = candidate_policies(base_spec, cands, probe=probe, bins=thresholds)
    outcomes = _measure(url, api_key, model, problems, policies, concurrency, "fitting")
    table = fit(outcomes, len(thresholds), tolerance)
    spec = policy_for(base_spec, probe, thresholds, table)
    out.write_text(dumps(spec) + "\n")
    summary = report(outcomes)
    if results:
        results.write_text(dumps(summary) + "\n")
    view = Table(title="accuracy / completion tokens per query, by difficulty bin")
    view.add_column("bin")
    for c in cands:
        view.add_column(c, justify="right")
    view.add_column("chosen")
    for b, rows in summary["by_bin"].items():
        view.add_row(str(b), *[f"{rows[c]['accuracy']:.2f} / {rows[c]['completion_tokens']:.0f}" if c in rows else "-"
                               for c in cands], f"{table[b]['method']}:{table[b]['width']}" if b >= 0 else "")
    Console().print(view)
    errors = sum(o.error is not None for o in outcomes)
    if errors:
        console.print(f"[red]{errors} request(s) failed[/]; first: {next(o.error for o in outcomes if o.error)}")
    if install:
        import httpx as _httpx

        key = api_key or os.environ.get("TTC_API_KEY", "")
        r = _httpx.put(f"{url}/v1/policies/{install}", json=spec, headers={"Authorization": f"Bearer {key}"})
        if r.status_code == 404:
            r = _httpx.post(f"{url}/v1/policies", json={"name": install, **spec},
                            headers={"Authorization": f"Bearer {key}"})
        console.print(f"policy {install}: HTTP {r.status_code}")
    console.print(f"wrote {out}")


def optimal_compare(
    policy_file: Annotated[Path | None, typer.Option(help="The fitted compute-optimal policy (ttc optimal fit "
                                                          "--out); without it the comparison leaves it out.")] = None,
    url: Annotated[str, typer.Option(help="The running service (loopback).")] = "http://127.0.0.1:8000",
    model: Annotated[str, typer.Option(help="Model of every request.")] = "arith-llama",
    levels: Annotated[str, typer.Option(help="Demo problem levels (comma list).")] = "1,2,3,4,5",
    per_level: Annotated[int, typer.Option(help="Problems per level.", min=1)] = 20,
    seed: Annotated[int, typer.Option(help="Seed of the problem set (1234: the demo model's held-out set).")] = 1234,
    n: Annotated[int, typer.Option(help="Whole samples of the majority / best-of-N / weighted policies.", min=1)] = 16,
    width: Annotated[int, typer.Option(help="Width of beam search, DVTS and particle filtering.", min=1)] = 8,
    base: Annotated[str | None, typer.Option(help="Base policy (JSON): verifier and search steps; default: the "
                                                  "demo's PRM settings.")] = None,
    prm_url: Annotated[str, typer.Option(help="The PRM of the default base policy.")] = DEMO_PRM_URL,
    concurrency: Annotated[int, typer.Option(help="Requests at once.", min=1)] = 4,
    out: Annotated[Path, typer.Option(help="Folder for compare.json, compare.md and compare.png.")] = Path(
        "optimal-compare"),
    api_key: Annotated[str | None, typer.Option(help="Key of the requests (or TTC_API_KEY).")] = None,
    only: Annotated[str | None, typer.Option(help="Run only these rows (comma list of their labels, as the table "
                                                  "prints them: 'majority-16,compute-optimal').")] = None,
) -> None:
    """Per difficulty level, accuracy against tokens of: a majority vote of N whole samples, best-of-N and
    a weighted majority of N by the PRM, beam search, DVTS and particle filtering by the PRM, best-of-N and
    the three searches by the generator's own likelihood (a solution's least likely token, no PRM), and
    the fitted compute-optimal policy, every problem under every policy with the same seed. Writes a
    markdown table, a plot (one panel per level) and every outcome."""
    from rich.console import Console

    from ttc_tools.demo.problems import make_set
    from ttc_tools.loadtest.target import require_loopback
    from ttc_tools.optimal import Problem, comparison_policies, dumps, markdown, plot, report

    require_loopback(url)
    console = Console(stderr=True)
    base_spec = json.loads(base) if base else demo_base(prm_url)
    fitted = json.loads(policy_file.read_text()) if policy_file else None
    policies = comparison_policies(base_spec, fitted, n=n, width=width)
    if only is not None:
        wanted = [label.strip() for label in only.split(",") if label.strip()]
        unknown = [label for label in wanted if label not in policies]
        if unknown or not wanted:
            raise typer.BadParameter(f"unknown row(s) {', '.join(map(repr, unknown))}; the rows: "
                                     f"{', '.join(policies)}", param_hint="--only")
        policies = {label: policies[label] for label in wanted}
    problems = [Problem(f"eval-{p.level}-{i}", p.question, str(p.gold), p.level) for i, p in
                enumerate(make_set(per_level, [int(x) for x in levels.split(",")], seed=seed))]

    outcomes = _measure(url, api_key, model, problems, policies, concurrency, "comparing")
    summary = report(outcomes)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(dumps({"policies": policies, **summary}) + "\n")
    table = markdown(summary["by_level"])
    (out / "compare.md").write_text(table)
    plot(summary["by_level"], out / "compare.png")
    Console().print(table)
    errors = [o.error for o in outcomes if o.error]
    if errors:
        console.print(f"[red]{len(errors)} request(s) failed[/]; first: {errors[0]}")
    console.print(f"wrote {out}/compare.md, compare.png, compare.json")


def trace_path(
    kind: Annotated[str, typer.Option(help="The request: chat (the default policy), stream-adaptive, batch4 "
                                           "(a batch of 4 prompts).")] = "chat",
    policy: Annotated[str | None, typer.Option(help="Set ttc.policy of a chat request.")] = None,
    list_functions: Annotated[bool, typer.Option("--list", help="Print the functions, by file.")] = False,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write {file: {function: calls}} here.")] = None,
) -> None:
    """Which of the service's files and functions one warm request runs (in-process, on the fake
    backend): the code a newcomer reads to follow it. Goal for a plain chat request: <= 20 files,
    <= 110 functions; tests/unit/test_request_path.py holds the counts where they are."""
    import asyncio

    from ttc_tools.pathtrace import KINDS, trace_request

    if kind not in KINDS:
        raise typer.BadParameter(f"use one of {', '.join(KINDS)}", param_hint="--kind")
    path, body = KINDS[kind]
    if policy is not None:
        body = {**body, "ttc": {**body.get("ttc", {}), "policy": policy}}
    trace = asyncio.run(trace_request(body, path))
    if list_functions:
        for line in trace.lines():
            typer.echo(line)
    typer.echo(f"{kind}{f' ({policy})' if policy else ''}: status {trace.status}, {trace.files} files, "
               f"{trace.functions} functions, {trace.total_calls} calls")
    if json_out is not None:
        json_out.write_text(json.dumps(trace.calls, indent=1) + "\n")


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add the tools' commands to the ``ttc`` command line."""
    from ttc_tools.loadtest import cli as loadtest_cli

    app.command("fake-backend", short_help="Run a fixed-latency fake OpenAI server.")(fake_backend)
    app.command("trace-path", short_help="The service's files and functions one chat request runs.")(trace_path)
    bench_app.command("overhead", short_help="Service overhead over calling the backend directly.")(bench_overhead)
    bench_app.command("answers", short_help="Requests/s and /health latency per sample style.")(bench_answers)
    bench_app.command("latency", short_help="Adaptive policies against one n=8 call: latency, throughput, tokens.")(
        bench_latency)
    bench_app.command("sandbox", short_help="Sandboxed programs per second and ms per program, 1-4 at once.")(
        bench_sandbox)
    optimal_app = typer.Typer(help="The compute-optimal policy.", no_args_is_help=True)
    optimal_app.command("fit", short_help="Fit the compute-optimal table from runs on the demo problems.")(
        optimal_fit)
    optimal_app.command("compare", short_help="Accuracy against tokens per level: whole samples, PRM search, "
                        "compute-optimal.")(optimal_compare)
    app.add_typer(optimal_app, name="optimal")
    loadtest_cli.register(app, bench_app)
