"""``ttc replay`` and ``ttc bench replay``: offline evaluation of a policy on recorded samples."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from app.protocol.requests import Priority

DEFAULT_BUDGETS = "1,2,4,8,16"


def _parse_budgets(text: str) -> list[float]:
    try:
        budgets = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"not a comma list of numbers: {text!r}", param_hint="--budgets") from None
    if not budgets or any(b <= 0 for b in budgets):
        raise typer.BadParameter("give one or more positive budgets, e.g. 1,2,4,8,16", param_hint="--budgets")
    return budgets


def _parse_params(text: str | None, hint: str = "--params") -> dict[str, Any]:
    if not text:
        return {}
    try:
        params = json.loads(text)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(f"not JSON: {exc.msg}", param_hint=hint) from None
    if not isinstance(params, dict):
        raise typer.BadParameter("must be a JSON object", param_hint=hint)
    return params


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


def _fmt_budget(b: float) -> str:
    return f"{b:g}"


def _ci(value: float, ci: tuple[float, float]) -> str:
    return f"{value:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"


def _parse_answer(kind: str | None, params: str | None) -> Any:
    """The ``--answer`` kind with its ``--answer-params`` (JSON) as an AnswerSpec, or None (auto)."""
    if kind is None and params is None:
        return None
    from pydantic import ValidationError

    from app.answers import AnswerSpec

    try:
        spec = AnswerSpec.model_validate({"kind": kind or "auto", "params": _parse_params(params)})
        spec.validated_params()
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise typer.BadParameter(f"{where}: {first.get('msg')}", param_hint="--answer / --answer-params") from None
    return spec


SANDBOX_HINT = "for ttc replay that is --sandbox-mode unsandboxed"


def _policy_names(text: str) -> list[str]:
    """The comma list of ``--policy``, in order, each once."""
    names = list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names:
        raise typer.BadParameter("give one or more policy names, e.g. adaptive,confident", param_hint="--policy")
    return names


def progress_console(enabled: bool) -> Any:
    """Where the progress bar goes: stderr when ``enabled`` and stderr is a terminal, else nowhere (None)."""
    import sys

    if not enabled or not sys.stderr.isatty():
        return None
    from rich.console import Console

    return Console(stderr=True)


def _run(data: Path, policy: str, params: str | None, aggregator: str | None, verifier: str | None, budgets: str,
         seeds: int, cap: int | None, resamples: int, answer: Any = None, verifier_params: str | None = None,
         sandbox_mode: str = "bwrap", sandbox_concurrency: int | None = None, schedule: str | None = None,
         progress: Any = None, priority: str | None = None) -> list[Any]:
    """Load, resolve every policy of the comma list ``policy`` (all before any runs) and evaluate each in
    turn; returns their :class:`Report` objects in order. One progress bar counts every (policy,
    budget, seed) run on the ``progress`` console (None: no bar). ``params``, ``aggregator``,
    ``verifier``, ``answer``, ``schedule`` and ``priority`` apply to every policy. A file whose problems all carry
    tests gets the ``code`` answer kind unless ``answer`` is given."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from app.backends.replay import ReplayFormatError, load_problems
    from app.replay.evaluator import ReplayConfigError, code_runner, default_answer, evaluate, resolve_policy

    budget_list = _parse_budgets(budgets)
    names = _policy_names(policy)
    if sandbox_mode not in ("bwrap", "unsandboxed"):
        raise typer.BadParameter("use bwrap or unsandboxed", param_hint="--sandbox-mode")
    reports = []
    try:
        problems = load_problems(data)
        kind = answer if answer is not None else default_answer(problems)
        chosen = [resolve_policy(name, _parse_params(params), aggregator, verifier, kind,
                                 _parse_params(verifier_params, "--verifier-params"), schedule, priority)
                  for name in names]
        for pol in chosen:
            warning = unscored_margin_warning(pol)
            if warning:
                typer.echo(f"warning: {warning}", err=True)
        runner = code_runner(sandbox_mode, sandbox_concurrency) if any(p.tests for p in problems) else None
        with Progress(TextColumn("[bold]replay[/] {task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), transient=True, console=progress, disable=progress is None) as bar:
            task = bar.add_task(data.name, total=len(chosen) * len(budget_list) * seeds)
            for pol in chosen:
                bar.update(task, description=f"{pol.name} on {data.name}")
                report = evaluate(problems, pol, budget_list, seeds, cap=cap, resamples=resamples,
                                  on_run=lambda: bar.advance(task), code=runner)
                report.data = str(data)
                reports.append(report)
    except ReplayFormatError as exc:
        raise _fail(str(exc)) from None
    except ReplayConfigError as exc:
        message = str(exc)
        if "sandbox.mode: unsandboxed" in message:
            message += f" ({SANDBOX_HINT})"
        raise _fail(message) from None
    except OSError as exc:
        raise _fail(f"cannot read {data}: {exc.strerror or exc}") from None
    return reports


def unscored_margin_warning(policy: Any) -> str | None:
    """A margin policy (``confident``) without a verifier counts each vote as 1, so a lead of
    ``margin <= 1`` is reached by the first sample: say so (None when that is not the case)."""
    if policy.spec.allocator != "margin" or policy.verifier != "none":
        return None
    margin = float(policy.spec.params.get("margin", 0.5))
    if margin > 1:
        return None
    return (f"{policy.name}: with --verifier none every vote weighs 1, so margin {margin:g} is reached by the "
            "first sample and every query stops after one; use --verifier likelihood (or ground_truth, scores), "
            "or --params '{\"margin\": 2}' for a lead of two votes")


def replay_json(reports: list[Any]) -> dict[str, Any]:
    """The ``--json`` document: one policy's report as it always was; several under ``reports``."""
    if len(reports) == 1:
        return dict(reports[0].to_json())
    return {"policies": [r.policy.name for r in reports], "reports": [r.to_json() for r in reports]}


def plot_paths(plot: Path, names: list[str]) -> list[Path]:
    """``--plot`` as given for one policy; ``NAME-POLICY.png`` beside it for each of several."""
    if len(names) == 1:
        return [plot]
    return [plot.with_name(f"{plot.stem}-{name}{plot.suffix or '.png'}") for name in names]


def print_report(report: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.width = max(console.width, 120)
    axis = ("budget = per-query sample cap (per-query policy)" if report.per_query
            else "budget = mean samples per problem, shared by the batch")
    table = Table(title=f"replay {report.policy.name} on {Path(report.data).name}: {report.n_problems} problems, "
                        f"{report.seeds} seeds, verifier {report.policy.verifier}", caption=axis)
    for col, justify in (("budget", "right"), ("method", "left"), ("mean samples", "right"),
                         ("accuracy [95% CI]", "right"), ("coverage [95% CI]", "right"),
                         ("efficiency", "right"), ("tokens/problem", "right"), ("steps p50 / p90", "right")):
        table.add_column(col, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for i, row in enumerate(report.rows):
        eff = report.efficiency[i]
        cost = report.costs[i] if report.costs and report.has_tokens else None
        for method, r, e in ((report.policy.name, row, "n/a" if eff is None else f"{eff:.2f}x"),
                             ("uniform ref", report.uniform[i], ""), ("oracle", report.oracle[i], "")):
            mine = r is row and cost is not None
            drawn = f"{r.mean_samples:.2f}"
            if mine and cost and cost.get("cut"):
                drawn += f" ({cost['cut']:.2f} cut)"
            table.add_row(_fmt_budget(row.budget) if r is row else "", method, drawn,
                          _ci(r.accuracy, r.accuracy_ci), _ci(r.coverage, r.coverage_ci), e,
                          "-" if r.tokens is None else f"{r.tokens:.1f}",
                          f"{cost['steps_p50']:.0f} / {cost['steps_p90']:.0f}" if mine and cost else "",
                          end_section=r is report.oracle[i])
    schedule = report.policy.spec.schedule.mode if report.policy.spec.schedule else "rounds"
    if report.policy.spec.schedule is not None and not report.policy.spec.schedule.speculate:
        schedule += " (priority tokens: no speculation)"
    table.caption = f"{axis}; schedule {schedule}: steps = simulated latency, one per generated token"
    console.print(table)
    console.print(f"data set: pass@1 {report.pass_at_1:.3f}, majority@{report.k} {report.majority_at_k:.3f} "
                  "(uniform majority vote over every recorded sample)")
    reach = report.reach
    if reach is not None:
        head = (f"tokens to reach majority@{reach['k']} accuracy ({reach['accuracy']:.3f} +- 0.005; a majority vote "
                f"of {reach['k']} costs {reach['majority_tokens']:.0f} tokens/problem): ")
        console.print(head + ("not reached at any budget given" if reach["tokens"] is None else
                              f"{reach['tokens']:.0f} at budget {_fmt_budget(reach['budget'])} "
                              f"({reach['ratio']:.2f}x, {1 - reach['ratio']:.0%} fewer)"))
    if not report.has_tokens:
        console.print("[yellow]notice[/]: this file records no 'tokens' per sample, so tokens per problem and "
                      "latency in token steps are unknown ('-'), not 0")
    console.print("efficiency = mean samples uniform needs for the policy's accuracy / the policy's mean "
                  "samples (n/a: uniform never reaches it)")
    keys = report.key_stats
    console.print(f"answer kind {report.policy.answer.kind if report.policy.answer else 'auto'}: "
                  f"{keys.get('pooled', 0)} problem(s) keyed in worker processes, {keys.get('fallbacks', 0)} "
                  "fell back to text keys")
    code = report.code_stats
    if code:
        console.print(
            f"code: {code['programs']:.0f} distinct program(s) of {code['problems']:.0f} problem(s) executed once "
            f"each: {code['test_runs']:.0f} test run(s) ({code['tests_s']:.2f} s), {code['behaviour_runs']:.0f} "
            f"behaviour run(s) for answer keys ({keys.get('behaviour', 0)} problem(s) keyed by behaviour, "
            f"{keys.get('code_fallbacks', 0)} program(s) by text; {code['keys_s']:.2f} s); sandbox "
            f"{code['sandbox_s']:.2f} s summed over {code['concurrency']:.0f} at once; "
            f"{code['sandbox_errors']:.0f} sandbox error(s), {code['recorded_mismatch']:.0f} recorded 'correct' "
            "flag(s) contradicted")
    t = report.timings
    up_front = (f"code tests {t['execute_s']:.2f} s, answer keys {t['keys_s']:.2f} s, " if "execute_s" in t
                else "")
    console.print(f"wall time {report.wall_s:.2f} s ({up_front}engine runs {t.get('runs_s', t['policy_s']):.2f} s, "
                  f"baselines + bootstrap {t['baselines_s']:.2f} s; {t['cpu_s']:.2f} s CPU)")


def bench_plan_time(policy: Any, queries: int) -> dict[str, float]:
    """Milliseconds one ``plan`` round takes over ``queries`` active queries for ``policy``'s allocator
    (:func:`allocators.bench.bench_plan`): ``first`` (fresh caches) and ``steady`` (median of later rounds)."""
    from allocators import bench_plan

    label = policy.spec.allocator
    ms = bench_plan(queries, policies=[label], configs={label: (label, dict(policy.spec.params))})
    return {"first": ms[f"{label}:first"], "steady": ms[label]}


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add ``ttc replay`` to ``app`` and ``ttc bench replay`` to ``bench_app``."""

    @app.command("replay", short_help="Replay policies on recorded samples (offline evaluation).")
    def replay(
        data: Annotated[Path, typer.Option(help="Replay JSONL file (one problem per line: id, question, gold, "
                                                "answers, correct, optional scores; code problems: tests, "
                                                "texts, optional program and entry_point).")],
        policy: Annotated[str, typer.Option(
            help="Allocator name or built-in policy name, or a comma list of them: each is replayed in turn "
                 "(one table each; the options below apply to every one).")] = "elimination",
        params: Annotated[str | None, typer.Option(help="Allocator params as a JSON object.")] = None,
        aggregator: Annotated[str | None, typer.Option(
            help="Aggregator (default: majority; weighted_majority with a verifier).")] = None,
        verifier: Annotated[str | None, typer.Option(
            help="none | ground_truth (recorded correctness, 1/0) | scores (recorded reward-model scores) | "
                 "likelihood (each sample's probability from its recorded logprobs and tokens) | code_tests "
                 "(each sample's program run on its problem's tests in the sandbox). Default: the "
                 "built-in policy's own (likelihood for confident), else none.")
        ] = None,
        verifier_params: Annotated[str | None, typer.Option(
            help='Params of the code_tests verifier as JSON: {"score": "fraction"} (default: share of tests '
                 'passed) or {"score": "all"} (1 when every test passes, else 0); of the likelihood verifier: '
                 '{"temperature": T} (score exp(sum of log-probs / T); default: the built-in policy\'s own).')] = None,
        budgets: Annotated[str, typer.Option(help="Mean samples per problem, comma separated.")] = DEFAULT_BUDGETS,
        seeds: Annotated[int, typer.Option(help="Seeds (sample orders) per budget.", min=1)] = 20,
        cap: Annotated[int | None, typer.Option(
            help="Per-problem sample cap (default: all recorded samples).", min=1)] = None,
        resamples: Annotated[int, typer.Option(help="Bootstrap resamples for the 95% intervals.", min=10)] = 1000,
        answer: Annotated[str | None, typer.Option(
            help="Answer kind: auto (default) | number | math | choice | regex | json | text | code | none.")] = None,
        answer_params: Annotated[str | None, typer.Option(
            help='Params of the answer kind as a JSON object, e.g. {"pattern": "Answer: (.+)"}.')] = None,
        sandbox_mode: Annotated[str, typer.Option(
            help="Problems with tests: bwrap (bubblewrap sandbox) or, explicitly, unsandboxed (rlimits only: "
                 "the programs run without isolation).")] = "bwrap",
        sandbox_concurrency: Annotated[int | None, typer.Option(
            help="Problems with tests: programs run at once (default: one per core).", min=1)] = None,
        schedule: Annotated[str | None, typer.Option(
            help="rounds (default; stream for deepconf, whose traces are cut only when streamed, from the "
                 "file's recorded token-confidence traces) | stream. Either is replayed on a "
                 "simulated clock where a sample takes as many steps as it has tokens: the table then "
                 "also shows tokens per problem and latency in token steps.")] = None,
        priority: Annotated[Priority | None, typer.Option(
            help="A live request's ttc.priority, for --schedule stream: latency (default: samples start wide, "
                 "the speculation of an idle service) or tokens (never more samples running than the policy "
                 "asks for). Rounds never speculate.")] = None,
        json_out: Annotated[Path | None, typer.Option(
            "--json", help='Write the results as JSON here (several policies: {"policies": [...], "reports": '
                           '[one report per policy]}).')] = None,
        plot: Annotated[Path | None, typer.Option(
            help="Write accuracy/coverage vs samples (PNG) here (several policies: one file each, "
                 "NAME-POLICY.png).")] = None,
        progress: Annotated[bool, typer.Option(
            help="A progress bar over every (policy, budget, seed) run, on stderr when it is a terminal.")] = True,
    ) -> None:
        """Replay a policy on recorded samples through the service's engine loop: per mean budget, mean
        samples used, accuracy of the selected answer and coverage (any correct sample drawn) with 95%
        bootstrap intervals, next to uniform majority voting and an oracle, plus the compute-efficiency
        ratio. For per-query policies (fixed, adaptive_consistency, esc) the budget is the per-query cap.

        Problems with tests (code): every distinct program runs its tests once, in the sandbox, before
        the runs; a sample is correct when it passes them all. A file of such problems gets the code
        answer kind (programs equal by behaviour on the prompt's doctest inputs, else by text)."""
        if schedule not in (None, "rounds", "stream"):
            raise typer.BadParameter("use rounds or stream", param_hint="--schedule")
        reports = _run(data, policy, params, aggregator, verifier, budgets, seeds, cap, resamples,
                       _parse_answer(answer, answer_params), verifier_params, sandbox_mode, sandbox_concurrency,
                       schedule, progress=progress_console(progress), priority=priority)
        for report in reports:
            print_report(report)
        if json_out is not None:
            json_out.write_text(json.dumps(replay_json(reports), indent=2))
        if plot is not None:
            from app.replay.plot import plot_report

            for report, path in zip(reports, plot_paths(plot, [r.policy.name for r in reports]), strict=True):
                plot_report(report, path)

    @bench_app.command("replay", short_help="Time a full replay and one planning round.")
    def bench_replay(
        data: Annotated[Path, typer.Option(help="Replay JSONL file.")],
        policy: Annotated[str, typer.Option(help="Allocator name or built-in policy name.")] = "elimination",
        params: Annotated[str | None, typer.Option(help="Allocator params as a JSON object.")] = None,
        verifier: Annotated[str | None, typer.Option(
            help="none | ground_truth | scores | likelihood | code_tests (default: the policy's own, else none).")
        ] = None,
        budgets: Annotated[str, typer.Option(help="Mean budgets, comma separated.")] = DEFAULT_BUDGETS,
        seeds: Annotated[int, typer.Option(help="Seeds per budget.", min=1)] = 20,
        queries: Annotated[int, typer.Option(help="Active queries for the planning benchmark.", min=1)] = 10_000,
        answer: Annotated[str | None, typer.Option(help="Answer kind (default: auto).")] = None,
        answer_params: Annotated[str | None, typer.Option(help="Params of the answer kind (JSON).")] = None,
    ) -> None:
        """Wall time of a full replay (every budget x seed through the engine, plus the baselines;
        target < 30 s for 395 problems x 5 budgets x 20 seeds on one core) and the time one ``plan``
        round takes for QUERIES active queries."""
        if len(_policy_names(policy)) > 1:
            raise typer.BadParameter("bench replay times one policy", param_hint="--policy")
        [report] = _run(data, policy, params, None, verifier, budgets, seeds, None, 1000,
                        _parse_answer(answer, answer_params), progress=progress_console(True))
        from app.replay.evaluator import resolve_policy

        plan = bench_plan_time(resolve_policy(policy, _parse_params(params), None, verifier), queries)
        n_runs = len(report.rows) * seeds
        typer.echo(f"full replay: {report.n_problems} problems x {len(report.rows)} budgets x {seeds} seeds "
                   f"({n_runs} engine runs): {report.wall_s:.2f} s wall "
                   f"(engine {report.timings['policy_s']:.2f} s, baselines {report.timings['baselines_s']:.2f} s), "
                   f"{report.timings['cpu_s']:.2f} s CPU")
        typer.echo(f"plan, {queries} active queries ({policy}): first round {plan['first']:.2f} ms, "
                   f"steady-state round {plan['steady']:.2f} ms")
        if report.code_stats:
            t = report.timings
            typer.echo(f"of which up front: code tests {t['execute_s']:.2f} s ({report.code_stats['test_runs']:.0f} "
                       f"sandbox runs), answer keys {t['keys_s']:.2f} s; engine runs {t['runs_s']:.2f} s")
