"""Batches: many prompts, one shared budget, one allocation policy across them.

The batch adapter of the run service: a batch becomes one :class:`~app.runner.RunRequest` whose
queries are its prompts, run by the same :class:`~app.runner.Runner` as single requests (so it is
metered, charged, recorded and logged the same way); the allocator sees every prompt's state each
round and decides where the shared budget goes (the elimination / bandit policies). Small batches
answer synchronously (a failure is the request's error status); large ones run as background jobs
polled by id (a failure is ``status: failed`` with the error).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.answers import AnswerSpec
from app.auth import Principal
from app.backends.base import SamplingRequest
from app.config import LimitsConfig
from app.engine import Query, RoundEvent, RunLimits, RunResult
from app.errors import InvalidRequest, NotFound, TTCError
from app.policy import PolicyResolver, PolicySnapshot, Schedule, answer_error, check_targets, resolve
from app.runner import Runner, RunRequest
from app.wire import ChatMessage, PolicySpec, ScheduleSpec

log = logging.getLogger("ttc.batches")


class BatchBudget(BaseModel):
    """The shared budget: ``total_samples`` or ``mean_samples`` (x number of prompts), optional tokens."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)
    total_samples: int | None = Field(None, ge=1, le=10**9)
    mean_samples: float | None = Field(None, gt=0, le=10**6)
    total_tokens: int | None = Field(None, ge=1, le=10**12)
    max_samples_per_prompt: int | None = Field(None, ge=1, le=10**6)
    deadline_ms: int | None = Field(None, ge=1, le=86_400_000)

    @model_validator(mode="after")
    def _one_of(self) -> BatchBudget:
        if (self.total_samples is None) == (self.mean_samples is None):
            raise ValueError("give exactly one of total_samples or mean_samples")
        return self


MAX_TRACE = 256
"""Progress snapshots a batch keeps (per round, or per finished sample in the stream schedule)."""


class BatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)
    model: str | None = None
    prompts: list[str] | None = Field(None, min_length=1)
    messages: list[list[ChatMessage]] | None = Field(None, min_length=1)
    references: list[str | None] | None = None
    budget: BatchBudget
    policy: str | PolicySpec | None = None
    answer: AnswerSpec | None = Field(None, description="Answer kind for every prompt (overrides the policy's)")
    schedule: ScheduleSpec | None = Field(None, description="rounds | stream, or {mode, width} (overrides the "
                                          "policy's)")
    max_tokens: int | None = Field(None, ge=1, le=10**9)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stop: str | list[str] | None = Field(None, max_length=16)
    seed: int | None = Field(None, ge=-(2**63), lt=2**63)
    background: bool | None = Field(None, description="Force a background job (202) or a synchronous answer")

    @model_validator(mode="after")
    def _prompts_or_messages(self) -> BatchRequest:
        if (self.prompts is None) == (self.messages is None):
            raise ValueError("give exactly one of prompts or messages")
        return self

    def size(self) -> int:
        return len(self.prompts or self.messages or [])


@dataclass
class BatchJob:
    id: str
    snapshot: PolicySnapshot
    size: int
    total_samples: int
    created: float = field(default_factory=time.time)
    status: str = "queued"
    rounds: int = 0
    samples_drawn: int = 0
    trace: list[dict[str, int]] = field(default_factory=list)
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    task: asyncio.Task[None] | None = None
    owner: str | None = None

    def view(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id, "object": "ttc.batch", "status": self.status, "created": int(self.created),
            "policy": self.snapshot.describe(),
            "progress": {"rounds": self.rounds, "samples_drawn": self.samples_drawn,
                         "budget_samples": self.total_samples, "prompts": self.size},
        }
        if self.result is not None:
            out.update(self.result)
        if self.error is not None:
            out["error"] = self.error
        return out


class BatchManager:
    """Holds the batch jobs of this process (bounded: the oldest finished ones are forgotten) and
    turns batch requests into runs of the one run service."""

    def __init__(self, runner: Runner, policies: PolicyResolver, limits: LimitsConfig, *,
                 sync_max_prompts: int = 32, keep: int = 1000, background: bool = True) -> None:
        self.runner = runner
        self.policies = policies
        self.limits = limits
        self.background = background  # False with several workers: a poll could reach another one
        self.jobs: dict[str, BatchJob] = {}
        self.sync_max_prompts = sync_max_prompts
        self.keep = keep

    def get(self, job_id: str, principal: Principal | None = None) -> BatchJob:
        """A batch by id. It belongs to the key that made it: another user key gets the same 404 as
        for an id that does not exist (admins see every batch)."""
        job = self.jobs.get(job_id)
        if job is None or (principal is not None and principal.role != "admin" and job.owner != principal.key_id):
            raise NotFound(f"No batch with id {job_id!r}.", param="batch_id", code="batch_not_found")
        return job

    def _remember(self, job: BatchJob) -> None:
        self.jobs[job.id] = job
        if len(self.jobs) > self.keep:
            done = [j for j in self.jobs.values() if j.status in ("completed", "failed")]
            for old in done[: len(self.jobs) - self.keep]:
                del self.jobs[old.id]

    def _check_size(self, body: BatchRequest) -> None:
        """Each prompt against ``limits`` (messages, characters), and the per-sample max_tokens."""
        lim = self.limits
        if body.max_tokens is not None and body.max_tokens > lim.max_tokens:
            raise InvalidRequest(f"max_tokens={body.max_tokens} is above this server's limit of {lim.max_tokens}.",
                                 param="max_tokens", code="too_large")
        for i, prompt in enumerate(body.prompts or []):
            if len(prompt) > lim.max_prompt_chars:
                raise InvalidRequest(f"Prompt {i} has {len(prompt)} characters, above the limit of "
                                     f"{lim.max_prompt_chars}.", param=f"prompts[{i}]", code="too_large")
        for i, messages in enumerate(body.messages or []):
            chars = sum(len(str(m.content or "")) for m in messages)
            if len(messages) > lim.max_messages or chars > lim.max_prompt_chars:
                raise InvalidRequest(f"Prompt {i} has {len(messages)} messages and {chars} characters, above the "
                                     f"limits of {lim.max_messages} and {lim.max_prompt_chars}.",
                                     param=f"messages[{i}]", code="too_large")

    async def prepare(self, body: BatchRequest, *, model: str, principal: Principal | None, request_id: str,
                      started: float) -> tuple[RunRequest, list[str | None]]:
        """The batch as a run (400s naming the field for what is wrong); also the references."""
        n = body.size()
        if n > self.limits.max_batch_prompts:
            raise InvalidRequest(f"{n} prompts is above this server's limit of {self.limits.max_batch_prompts}.",
                                 param="prompts")
        self._check_size(body)
        if body.references is not None and len(body.references) != n:
            raise InvalidRequest(f"references has {len(body.references)} entries for {n} prompts.",
                                 param="references")
        total = body.budget.total_samples if body.budget.total_samples is not None else round(
            (body.budget.mean_samples or 0) * n)
        param = "budget.total_samples" if body.budget.total_samples is not None else "budget.mean_samples"
        if total < n:
            raise InvalidRequest(
                f"The budget of {total} sample(s) is smaller than one sample per prompt ({n} prompts).",
                param=param, code="budget_too_small",
            )
        requested = body.policy
        if requested is None and principal is not None and principal.default_policy:
            requested = principal.default_policy
        snapshot = await resolve(self.policies, requested if requested is not None else "greedy", "policy")
        parts = await self.runner.parts_for(snapshot, body.seed)
        check_targets(snapshot, parts, operator=principal is None or principal.role == "admin", where="policy")
        if body.answer is not None:
            answer_error(body.answer, "answer")
            parts.answer = body.answer
        if body.schedule is not None:
            parts.schedule = Schedule.of(body.schedule)
        refs = body.references or [None] * n
        if parts.verifier is not None and parts.verifier.needs_reference and any(r is None for r in refs):
            raise InvalidRequest(f"Verifier {parts.verifier.name!r} needs a reference for every prompt.",
                                 param="references", code="reference_required")
        if parts.verifier is not None and parts.verifier.needs_tests:
            raise InvalidRequest(f"Verifier {parts.verifier.name!r} needs per-prompt tests, which batches do not "
                                 "take yet: send the prompts as single requests with ttc.tests.",
                                 param="policy.verifier", code="unsupported_value")
        cap = min(body.budget.max_samples_per_prompt or self.limits.max_samples, self.limits.max_samples)
        if body.temperature == 0:
            cap = 1  # greedy samples are all alike (and vLLM refuses n > 1 with greedy sampling)
        params: dict[str, Any] = {k: v for k, v in (("max_tokens", body.max_tokens), ("temperature", body.temperature),
                                                     ("top_p", body.top_p), ("stop", body.stop)) if v is not None}
        queries = []
        for i in range(n):
            if body.prompts is not None:
                req = SamplingRequest("completion", model, prompt=body.prompts[i], params=params, query_id=str(i))
            else:
                msgs = [m.model_dump(exclude_none=True) for m in (body.messages or [])[i]]
                req = SamplingRequest("chat", model, messages=msgs, params=params, query_id=str(i))
            queries.append(Query(id=str(i), request=req, cap=cap, reference=refs[i]))
        deadline = None
        if body.budget.deadline_ms is not None:
            deadline = asyncio.get_running_loop().time() + body.budget.deadline_ms / 1000
        limits = RunLimits(samples=total, tokens=body.budget.total_tokens, deadline=deadline,
                           partial_on_deadline=True)
        run = RunRequest("batch", request_id, model, snapshot, parts, queries, limits, body.seed, principal, started,
                         budget_param="budget.total_tokens")
        return run, refs

    async def submit(self, body: BatchRequest, *, model: str, principal: Principal | None,
                     request_id: str) -> tuple[BatchJob, bool]:
        """Validate and start a batch. Returns the job and whether it already finished (synchronous
        batches; their failure is raised, as a request's would be)."""
        run, refs = await self.prepare(body, model=model, principal=principal, request_id=request_id,
                                       started=time.perf_counter())
        job = BatchJob(f"batch_{uuid.uuid4().hex[:20]}", run.snapshot, len(run.queries), run.limits.samples or 0,
                       owner=principal.key_id if principal is not None else None)

        async def on_round(event: RoundEvent) -> None:
            job.rounds, job.samples_drawn = event.round, event.samples_drawn
            if len(job.trace) < MAX_TRACE:  # stream batches report after every sample: keep it bounded
                job.trace.append({r.query.id: r.state.spent for r in event.runs})

        async def execute() -> None:
            job.status = "in_progress"
            result = await self.runner.run(run, on_round)
            job.result = await _result_json(job, result, refs)
            job.status = "completed"

        sync = not body.background if body.background is not None else len(run.queries) <= self.sync_max_prompts
        if not sync and not self.background:
            raise InvalidRequest(
                f"Background batches need a single worker (this service runs several, and a poll could reach "
                f"another one): send at most {self.sync_max_prompts} prompts, or background: false.",
                param="background", code="unsupported_value")
        if sync:
            await execute()
            self._remember(job)
            return job, True

        async def background() -> None:
            try:
                await execute()
            except TTCError as exc:
                job.status, job.error = "failed", exc.body()["error"]
            except Exception as exc:  # a job must never die silently
                log.exception("batch %s failed", job.id)
                job.status, job.error = "failed", {"message": f"internal error: {type(exc).__name__}",
                                                   "type": "internal_error", "param": None, "code": None}

        self._remember(job)
        job.task = asyncio.create_task(background(), name=job.id)
        return job, False

    async def shutdown(self) -> None:
        for job in self.jobs.values():
            if job.task is not None and not job.task.done():
                job.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await job.task


async def _result_json(job: BatchJob, result: RunResult, refs: list[str | None]) -> dict[str, Any]:
    rows = []
    correct = 0
    for run, ref in zip(result.runs, refs, strict=True):
        sel = run.selection
        per_round = []
        prev = 0
        for snap in job.trace:
            spent = snap.get(run.query.id, prev)
            per_round.append(spent - prev)
            prev = spent
        row: dict[str, Any] = {
            "index": int(run.query.id),
            "answer": sel.answer if sel else None,
            "text": run.draws[sel.index].text if sel else None,
            "samples": run.state.spent,
            "confidence": sel.confidence if sel else 0.0,
            "votes": dict(sel.votes) if sel else {},
            "allocation": per_round,
        }
        if ref is not None:
            ok = bool(await run.is_correct(ref))
            row["correct"] = ok
            correct += ok
        rows.append(row)
    out: dict[str, Any] = {
        "results": rows,
        "summary": {"samples_drawn": result.samples_drawn, "rounds": result.rounds,
                    "stop_reason": result.stop_reason, "mean_samples": result.samples_drawn / len(rows),
                    "usage": result.usage.as_dict()},
    }
    if any(r is not None for r in refs):
        out["summary"]["accuracy"] = correct / sum(r is not None for r in refs)
    return out
