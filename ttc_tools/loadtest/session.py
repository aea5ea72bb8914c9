"""Run a list of levels in order, with live progress, scoring and an optional backend kill.

Levels run one after another (never overlapping, so each sees only its own load); the caller orders
them, e.g. by load level with policies interleaved inside each level. A :class:`KillSwitch` runs
alongside the whole session. After each level its records are scored (:mod:`ttc_tools.loadtest.scoring`)
and summarised (:func:`ttc_tools.loadtest.stats.summarize`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import quote

import httpx
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from ttc_tools.loadtest.data import Problem
from ttc_tools.loadtest.records import RequestRecord
from ttc_tools.loadtest.runner import LevelSpec, run_level
from ttc_tools.loadtest.scenario import KillPlan, KillSwitch
from ttc_tools.loadtest.scoring import score_records
from ttc_tools.loadtest.stats import LevelSummary, summarize
from ttc_tools.loadtest.target import require_loopback


@dataclass
class SessionResult:
    summaries: list[LevelSummary] = field(default_factory=list)
    records: list[RequestRecord] = field(default_factory=list)
    kill_outcome: str | None = None
    unscored: int = 0


def level_label(spec: LevelSpec) -> str:
    unit = "clients" if spec.mode == "closed" else "req/s"
    return f"{spec.policy} · {spec.mode} {spec.load:g} {unit}"


class _Meter:
    """Live progress of one level: bar over its time bound (or its request bound when only that is
    set), with running ok/failed counts."""

    def __init__(self, progress: Progress, spec: LevelSpec) -> None:
        duration, count = spec.bounds()
        self.by_count = spec.duration_s is None
        self.total = float(count) if self.by_count else duration
        self.progress = progress
        self.task = progress.add_task(level_label(spec), total=self.total, stats="")
        self.ok = self.failed = 0

    def on_record(self, rec: RequestRecord) -> None:
        if rec.error is None:
            self.ok += 1
        else:
            self.failed += 1
        done = float(self.ok + self.failed) if self.by_count else rec.end_s
        self.progress.update(self.task, completed=min(self.total, done),
                             stats=f"ok {self.ok}  failed {self.failed}")

    def finish(self) -> None:
        self.progress.update(self.task, completed=self.total)


GENERATION_COUNTER = "vllm:generation_tokens_total"


async def generated_tokens(urls: Sequence[str]) -> float:
    """The sum of vLLM's generation-token counter over ``urls`` (each a server's base URL)."""
    total = 0.0
    async with httpx.AsyncClient(timeout=10) as client:
        for url in urls:
            text = (await client.get(url.rstrip("/") + "/metrics")).text
            for line in text.splitlines():
                if line.startswith((GENERATION_COUNTER + "{", GENERATION_COUNTER + " ")):
                    total += float(line.rsplit(" ", 1)[1])
    return total


class UnknownName(ValueError):
    """A level names something the service says it does not have; ``option`` is the command-line option
    that named it."""

    option = "--policy"


class UnknownPolicy(UnknownName):
    """A level names a policy that the service says it does not have."""


class UnknownModel(UnknownName):
    """A level names a model that the service says it does not serve."""

    option = "--model"


async def refuse_unknown_names(specs: Sequence[LevelSpec]) -> None:
    """Before any load, raise :class:`UnknownPolicy` for a level whose ``ttc.policy`` is a name its
    service answers ``404 policy_not_found`` for (``GET /v1/policies/{name}``), and
    :class:`UnknownModel` for one whose ``model`` is not among the ids of a non-empty ``GET /v1/models``
    (the service then answers every request ``404 model_not_found``): every request of such a level
    would fail at once while the level ran its whole duration. Any other answer (a key without admin
    rights, a peer or fake without the route, no connection) leaves it to the run. Loopback targets
    only (:func:`require_loopback` raises for others, as a level would); one question per name."""
    names = {(require_loopback(s.url), s.ttc["policy"]): s.headers for s in specs
             if s.ttc is not None and isinstance(s.ttc.get("policy"), str)}
    models = {(require_loopback(s.url), s.model): s.headers for s in specs if s.model is not None}
    async with httpx.AsyncClient(timeout=10) as client:
        for (url, name), headers in names.items():
            try:
                r = await client.get(f"{url}/v1/policies/{quote(name, safe='')}", headers=headers)
                code = r.json().get("error", {}).get("code") if r.status_code == 404 else None
            except (httpx.HTTPError, ValueError, AttributeError):
                continue
            if code == "policy_not_found":
                raise UnknownPolicy(f"the service at {url} has no policy {name!r} (GET /v1/policies/{name}: 404); "
                                    "GET /v1/policies lists them, --policy-spec sends one inline")
        served: dict[str, list[str] | None] = {}
        for (url, model), headers in models.items():
            if url not in served:
                served[url] = await _model_ids(client, url, headers)
            known = served[url]
            if known and model not in known:
                raise UnknownModel(f"the service at {url} does not serve model {model!r}; it serves: "
                                   f"{', '.join(known)} (GET /v1/models)")


async def _model_ids(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> list[str] | None:
    """The ids ``GET /v1/models`` lists (``None``: no such answer, as from a peer without the route)."""
    try:
        r = await client.get(f"{url}/v1/models", headers=headers)
        data = r.json().get("data") if r.status_code == 200 else None
        return [str(m["id"]) for m in data] if isinstance(data, list) else None
    except (httpx.HTTPError, ValueError, AttributeError, KeyError, TypeError):
        return None


async def run_session(specs: Sequence[LevelSpec], problems: Sequence[Problem], *,
                      kill: KillPlan | None = None, console: Console | None = None,
                      score_timeout_s: float = 60.0, backend_metrics: Sequence[str] = (),
                      check_names: bool = True) -> SessionResult:
    """Run every level of ``specs`` in order; see the module docstring. With ``backend_metrics``
    (vLLM base URLs), each level also reports the tokens vLLM says it generated per request. A policy
    or model the service does not have raises :class:`UnknownName` before anything runs
    (``check_names=False``: the caller asked already, :func:`refuse_unknown_names`)."""
    if check_names:
        await refuse_unknown_names(specs)
    console = console or Console()
    out = SessionResult()
    switch = KillSwitch(kill) if kill is not None else None
    loop = asyncio.get_running_loop()
    kill_task = asyncio.create_task(switch.run(loop.time())) if switch is not None else None
    progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[stats]}"),
                        TimeElapsedColumn(), console=console, transient=False)
    try:
        with progress:
            for spec in specs:
                meter = _Meter(progress, spec)
                before = await generated_tokens(backend_metrics) if backend_metrics else None
                result = await run_level(spec, problems, meter.on_record)
                meter.finish()
                backend_tokens = None
                if before is not None and result.records:
                    # a cancelled request's last tokens reach the counter a moment later: wait for it to settle
                    after = await generated_tokens(backend_metrics)
                    while (settled := await _settled(backend_metrics)) != after:
                        after = settled
                    backend_tokens = (after - before) / len(result.records)
                out.unscored += await asyncio.to_thread(score_records, result.records,
                                                        timeout_s=score_timeout_s)
                kill_at = None
                if switch is not None and switch.fired_at is not None:
                    kill_at = switch.fired_at - result.started_at
                summary = summarize(result.records, policy=spec.policy, mode=spec.mode, load=spec.load,
                                    elapsed_s=result.elapsed_s, kill_at_s=kill_at, seed=spec.seed)
                summary.backend_tokens_per_query = backend_tokens
                out.summaries.append(summary)
                out.records.extend(result.records)
    finally:
        if kill_task is not None:
            kill_task.cancel()
    if switch is not None:
        out.kill_outcome = switch.outcome
    return out


async def _settled(urls: Sequence[str]) -> float:
    """The counter again after vLLM's next metrics update (it publishes about once a second)."""
    await asyncio.sleep(1.5)
    return await generated_tokens(urls)
