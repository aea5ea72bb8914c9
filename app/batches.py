"""Batches: many prompts, one shared budget, one allocation policy across them.

The batch adapter of the run service: a batch becomes one :class:`~app.prepare.RunSpec` (prepared by
the same :class:`~app.prepare.Preparer` as a single request) whose queries are its prompts, run by the
same :class:`~app.runner.Runner` as single requests (so it is metered, charged, recorded and logged the
same way); the allocator sees every prompt's state each round and decides where the shared budget
goes (the elimination / bandit policies). Small batches answer synchronously (a failure is the
request's error status); large ones run as background jobs polled by id
(a failure is ``status: failed`` with the error).

Every batch lives in the store (:mod:`app.store.batches`), so any replica answers for it. A
background batch is run by the replica holding its lease, which checkpoints every finished sample
(slot by slot) and the spend, and renews the lease every ``lease_s / 3``. Each replica also sweeps
for batches whose lease ran out (their replica died, or was stopped: a graceful stop gives its
leases up at once) and takes them over, up to ``max_running`` at a time: the run resumes from the
checkpoint (:class:`~app.run.Resume`, and the run's allocator's ``state_dict``), so no sample
already paid for is drawn again, and the shared budget counts the checkpointed samples. What was in
flight on the dead replica is lost (never delivered, never billed); its slots are drawn again.
Cancelling stops the holder's backend calls (at once when this replica holds the batch, else at the
holder's next checkpoint or renewal).
Leases are wall-clock deadlines: replicas' clocks must agree to well within ``lease_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from allocators import Allocator
from app.auth import Principal
from app.backends.base import Draw, SamplingRequest, Usage
from app.config import BatchesConfig
from app.errors import InvalidRequest, NotFound, TTCError
from app.policy import PolicySnapshot
from app.prepare import Needs, Preparer, RunSpec
from app.protocol import BatchRequest, PolicySpec
from app.run import Drawn, Query, QueryRun, Resume, RoundEvent, RunLimits, RunResult
from app.runner import Runner
from app.store.batches import BatchRecord, BatchStore

log = logging.getLogger("ttc.batches")


class LeaseLost(Exception):
    """This replica no longer holds the batch's lease (another took it over): stop, write nothing."""


class BatchCancelled(Exception):
    """A cancel was requested (seen at a checkpoint)."""


class Checkpoint:
    """Follows a background batch run: after every round (stream schedule: every delivery) the
    samples that finished since and the spend go to the store, renewing the lease.

    Writes never hold the engine up: :meth:`on_round` queues what is new and a writer task commits
    whatever has queued, one transaction at a time (a burst of finished samples becomes one write,
    not one each, so what a crash can lose is what arrived during the last write). A lost lease or a
    requested cancel found by a write is raised at the next :meth:`on_round` or at :meth:`flush`."""

    def __init__(self, manager: BatchManager, batch_id: str, saved: dict[str, int],
                 allocator: Allocator | None = None) -> None:
        self.manager = manager
        self.batch_id = batch_id
        self.saved = saved
        """Samples queued for (or already in) the store, per prompt."""
        self.allocator = allocator
        """The run's own allocator (not a policy's shared learning one): its state is checkpointed."""
        self._rows: list[tuple[str, int, dict[str, Any]]] = []
        self._progress: dict[str, Any] | None = None
        self._writer: asyncio.Task[None] | None = None

    async def on_round(self, event: RoundEvent) -> None:
        if self._writer is not None and self._writer.done():
            self._writer.result()  # LeaseLost / BatchCancelled found by the last write
        for run in event.runs:
            done = self.saved.get(run.query.id, 0)
            self._rows.extend((run.query.id, seq, _sample_json(run, seq)) for seq in range(done, len(run.draws)))
            self.saved[run.query.id] = len(run.draws)
        self._progress = _progress(event.round, event.samples_drawn, event.samples_cancelled, event.usage)
        if self.allocator is not None:
            self._progress["allocator"] = self.allocator.state_dict()
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write(), name=f"{self.batch_id}-checkpoint")

    async def _write(self) -> None:
        m = self.manager
        while self._progress is not None:
            rows, progress, self._rows, self._progress = self._rows, self._progress, [], None
            held = await m.store.checkpoint(self.batch_id, m.replica, rows, progress, time.time() + m.config.lease_s)
            if held is None:
                raise LeaseLost(self.batch_id)
            if held:
                raise BatchCancelled(self.batch_id)

    async def flush(self) -> None:
        """Wait until everything queued is written (raising what the writes found); call it once the
        run has ended (no :meth:`on_round` starts another writer then)."""
        if self._writer is not None:
            await self._writer


class BatchManager:
    """Submits, runs, resumes and cancels batches (see the module doc). ``background``: whether
    background batches are allowed (not when several workers share an in-memory store)."""

    def __init__(self, runner: Runner, preparer: Preparer, store: BatchStore,
                 config: BatchesConfig | None = None, *, background: bool = True) -> None:
        self.runner = runner
        self.preparer = preparer
        self.store = store
        self.config = config or BatchesConfig()
        self.background = background
        self.replica = uuid.uuid4().hex[:16]
        self.running: dict[str, asyncio.Task[None]] = {}
        """Background batches this replica runs now, by id."""
        self._cancelling: set[str] = set()
        self._tender: asyncio.Task[None] | None = None

    async def get(self, job_id: str, principal: Principal | None = None) -> BatchRecord:
        """A batch by id. It belongs to the key that made it: another user key gets the same 404 as
        for an id that does not exist (admins see every batch)."""
        rec = await self.store.get(job_id)
        if rec is None or not _may_see(principal, rec):
            raise NotFound(f"No batch with id {job_id!r}.", param="batch_id", code="batch_not_found")
        return rec

    async def page(self, principal: Principal | None, *, limit: int, after: str | None) -> tuple[list[BatchRecord],
                                                                                                bool]:
        """The caller's batches (an admin's: everyone's), newest first, a page of ``limit`` after the
        batch ``after``; and whether there are more."""
        before = None
        if after is not None:
            try:
                before = (await self.get(after, principal)).created_at
            except NotFound:
                raise NotFound(f"No batch with id {after!r}.", param="after", code="batch_not_found") from None
        everyone = principal is None or principal.role == "admin"
        rows = await self.store.page(principal.key_id if principal else None, everyone=everyone, limit=limit + 1,
                                     before=before)
        return rows[:limit], len(rows) > limit

    def check_raw(self, data: Any) -> None:
        """The batch's size against ``limits`` from the parsed JSON, before any model is built: the
        number of prompts, and each chat prompt's messages (count and text)."""
        if not isinstance(data, dict):
            return
        prep = self.preparer
        prompts, messages = data.get("prompts"), data.get("messages")
        for name, items in (("prompts", prompts), ("messages", messages)):
            if isinstance(items, list) and len(items) > prep.limits.max_batch_prompts:
                raise InvalidRequest(f"{len(items)} prompts is above this server's limit of "
                                     f"{prep.limits.max_batch_prompts}.", param=name)
        for i, chat in enumerate(messages if isinstance(messages, list) else []):
            if isinstance(chat, list):
                prep.check_prompt(chat, f"messages[{i}]")

    async def prepare(self, body: BatchRequest, *, model: str, principal: Principal | None, request_id: str,
                      started: float, snapshot: PolicySnapshot | None = None,
                      since: float | None = None) -> tuple[RunSpec, list[str | None]]:
        """The batch as a run (400s naming the field for what is wrong); also the references.
        ``snapshot``: the policy as resolved when the batch was submitted (a resumed batch);
        ``since``: when it was submitted (``time.time()``; its deadline counts from there)."""
        prep, limits = self.preparer, self.preparer.limits
        n = body.size()
        if n > limits.max_batch_prompts:
            raise InvalidRequest(f"{n} prompts is above this server's limit of {limits.max_batch_prompts}.",
                                 param="prompts")
        prep.check_max_tokens(body.max_tokens, "max_tokens")
        for i, prompt in enumerate(body.prompts or []):
            prep.check_prompt(prompt, f"prompts[{i}]")
        for i, messages in enumerate(body.messages or []):
            prep.check_prompt(messages, f"messages[{i}]")
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
        if snapshot is None:
            snapshot = await prep.resolve(body.policy, principal, where="policy", fallback="greedy")
        refs = body.references or [None] * n
        parts = await prep.build(snapshot, principal, seed=body.seed, where="policy", answer=body.answer,
                                 answer_where="answer", schedule=body.schedule,
                                 needs=Needs(references=all(r is not None for r in refs), reference_where="references",
                                             tests=True, chat=body.prompts is None))
        if parts.verifier is not None and parts.verifier.needs_tests:
            raise InvalidRequest(f"Verifier {parts.verifier.name!r} needs per-prompt tests, which batches do not "
                                 "take yet: send the prompts as single requests with ttc.tests.",
                                 param="policy.verifier", code="unsupported_value")
        cap = prep.cap(body.budget.max_samples_per_prompt, body.temperature)
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
        limits_ = RunLimits(samples=total, tokens=body.budget.total_tokens,
                            deadline=prep.deadline(body.budget.deadline_ms, since), partial_on_deadline=True)
        run = RunSpec("batch", request_id, model, snapshot, parts, tuple(queries), limits_, body.seed, principal,
                      started, budget_param="budget.total_tokens")
        return run, refs

    async def submit(self, body: BatchRequest, *, principal: Principal | None,
                     request_id: str) -> tuple[BatchRecord, bool]:
        """Validate and start a batch. Returns its record and whether it already finished (synchronous
        batches; their failure is raised, as a request's would be)."""
        model = self.preparer.model(body.model)
        run, refs = await self.prepare(body, model=model, principal=principal, request_id=request_id,
                                       started=time.perf_counter())
        sync = not body.background if body.background is not None else len(run.queries) <= self.config.sync_max_prompts
        if not sync and not self.background:
            raise InvalidRequest(
                f"Background batches need a store the workers share (this service runs several workers on an "
                f"in-memory store): send at most {self.config.sync_max_prompts} prompts, or background: false.",
                param="background", code="unsupported_value")
        batch_id = f"batch_{uuid.uuid4().hex[:20]}"
        row = {"id": batch_id, "owner": principal.key_id if principal else None,
               "owner_role": principal.role if principal else "admin",
               "request": {"body": body.model_dump(mode="json", exclude_none=True), "model": model,
                           "principal": dataclasses.asdict(principal) if principal else None,
                           "spec": run.snapshot.spec.model_dump(mode="json", exclude_none=True)},
               "policy": run.snapshot.describe(), "prompts": len(run.queries),
               "budget_samples": run.limits.samples or 0}
        if sync:
            result = await self.runner.run(run)
            await self.store.insert(**row, status="completed", progress=_final(result),
                                    result=await _result_json(result, refs))
            return await self.get(batch_id), True
        mine = len(self.running) < self.config.max_running
        await self.store.insert(**row, status="queued", progress=_progress(0, 0, 0, Usage()),
                                lease_owner=self.replica if mine else None,
                                lease_until=time.time() + self.config.lease_s if mine else None)
        rec = await self.get(batch_id)
        if mine:
            self._start(rec)
        return rec, False

    async def cancel(self, job_id: str, principal: Principal | None) -> BatchRecord:
        """Cancel a queued or running batch (finished ones are left as they are)."""
        rec = await self.get(job_id, principal)
        await self.store.request_cancel(job_id, time.time())
        await self._stop(job_id)
        return await self.get(rec.id)

    async def delete(self, job_id: str, principal: Principal | None) -> None:
        """Delete a batch: it is cancelled first (its backend calls stop: at once when this replica
        runs it, else at its replica's next checkpoint, which finds the batch gone), then it and its
        samples are removed; reading it afterwards is a 404."""
        await self.get(job_id, principal)
        await self.store.request_cancel(job_id, time.time())
        await self._stop(job_id)
        await self.store.delete(job_id)

    async def cancel_owned(self, key_id: str) -> list[str]:
        """Cancel every queued or running batch of a key (it was revoked); their ids."""
        ids = await self.store.active_of(key_id)
        now = time.time()
        for job_id in ids:
            await self.store.request_cancel(job_id, now)
            await self._stop(job_id)
        return ids

    async def _stop(self, job_id: str) -> None:
        """Stop this replica's run of the batch, if it runs it, and wait (a little) for it to end."""
        task = self.running.get(job_id)
        if task is not None:
            self._cancelling.add(job_id)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), 10)

    # -- running --------------------------------------------------------------------------------

    def _start(self, rec: BatchRecord) -> None:
        self.running[rec.id] = asyncio.create_task(self._run(rec), name=rec.id)
        self.runner.metrics.batches_running.set(len(self.running))

    async def _run(self, rec: BatchRecord) -> None:
        """Run (or resume) a background batch this replica holds, to its end in the store."""
        try:
            body = BatchRequest.model_validate(rec.request["body"])
            who = rec.request.get("principal")
            principal = Principal(**who) if who else None
            snapshot = PolicySnapshot(rec.policy["name"], rec.policy["version"],
                                      PolicySpec.model_validate(rec.request["spec"]))
            run, refs = await self.prepare(body, model=rec.request["model"], principal=principal, request_id=rec.id,
                                           started=time.perf_counter(), snapshot=snapshot, since=rec.created_at)
            saved = await self.store.samples(rec.id)
            own = None if run.parts.learns else run.parts.allocator
            track = Checkpoint(self, rec.id, {q: len(rows) for q, rows in saved.items()}, own)
            if own is not None:
                own.load_state_dict(rec.progress.get("allocator", {}))
            if saved or rec.progress.get("samples_cancelled"):
                run = replace(run, resume=_resume(saved, rec.progress))
                log.info("batch %s resumed by replica %s with %d checkpointed sample(s)", rec.id, self.replica,
                         sum(map(len, saved.values())))
            try:
                result = await self.runner.run(run, track.on_round)
            finally:  # what finished is kept, whatever stopped the run (a failure, a cancel, a shutdown)
                with contextlib.suppress(Exception):
                    await asyncio.shield(track.flush())
            await track.flush()  # a lost lease or a cancel found by the last write
            await self.store.finish(rec.id, self.replica, "completed", progress=_final(result),
                                    result=await _result_json(result, refs))
        except asyncio.CancelledError:
            if rec.id not in self._cancelling:
                raise  # shutting down (the lease is given up, another replica resumes) or lease lost
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()  # a cancel we asked for is handled here
            await self.store.finish(rec.id, self.replica, "cancelled")
        except BatchCancelled:
            await self.store.finish(rec.id, self.replica, "cancelled")
        except LeaseLost:
            log.warning("batch %s: replica %s lost its lease (taken over); stopped", rec.id, self.replica)
        except TTCError as exc:
            await self.store.finish(rec.id, self.replica, "failed", error=exc.body()["error"])
        except Exception as exc:  # a job must never die silently
            log.exception("batch %s failed", rec.id)
            await self.store.finish(rec.id, self.replica, "failed", error={
                "message": f"internal error: {type(exc).__name__}", "type": "internal_error", "param": None,
                "code": None})
        finally:
            self.running.pop(rec.id, None)
            self._cancelling.discard(rec.id)
            self.runner.metrics.batches_running.set(len(self.running))

    async def start(self) -> None:
        """Start tending leases: renew this replica's, notice cancels, take over expired batches."""
        self._tender = asyncio.create_task(self._tend(), name="batch-leases")

    async def _tend(self) -> None:
        every = self.config.lease_s / 3
        while True:
            try:
                await self.tend()
            except Exception as exc:  # the store may be briefly unreachable: try again next time
                log.warning("batch lease upkeep failed: %s", exc)
            await asyncio.sleep(every * random.uniform(0.8, 1.0))

    async def tend(self) -> None:
        """One upkeep pass (see :meth:`start`)."""
        now = time.time()
        until = now + self.config.lease_s
        held = await self.store.renew(self.replica, list(self.running), until)
        for batch_id, task in list(self.running.items()):
            if batch_id not in held:
                log.warning("batch %s: lease lost by replica %s; stopping it", batch_id, self.replica)
                task.cancel()
            elif held[batch_id]:
                self._cancelling.add(batch_id)
                task.cancel()
        free = self.config.max_running - len(self.running)
        if free > 0:
            for rec, before in await self.store.claim_expired(self.replica, now, until, free):
                if rec.id in self.running:  # our own, its lease lapsed while this loop was busy: renewed now
                    continue
                if before is not None:
                    log.info("batch %s taken over from replica %s by replica %s", rec.id, before, self.replica)
                    self.runner.metrics.batch_takeovers.inc()
                self._start(rec)

    async def shutdown(self) -> None:
        """Stop tending, stop the batches this replica runs and give their leases up (another replica
        resumes them from their checkpoints at its next sweep)."""
        if self._tender is not None:
            self._tender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._tender
        ids = list(self.running)
        for task in list(self.running.values()):
            task.cancel()
        for task in list(self.running.values()):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        with contextlib.suppress(Exception):
            await self.store.release(self.replica, ids)


def _may_see(principal: Principal | None, rec: BatchRecord) -> bool:
    return principal is None or principal.role == "admin" or rec.owner == principal.key_id


def _progress(rounds: int, drawn: int, cancelled: int, usage: Usage) -> dict[str, Any]:
    return {"rounds": rounds, "samples_drawn": drawn, "samples_cancelled": cancelled,
            "usage": {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens}}


def _final(result: RunResult) -> dict[str, Any]:
    return _progress(result.rounds, result.samples_drawn, result.samples_cancelled, result.usage)


def _sample_json(run: QueryRun, seq: int) -> dict[str, Any]:
    """A finished sample as its checkpoint row keeps it (the backend's log-prob objects are not kept)."""
    d, s = run.draws[seq], run.state.samples[seq]
    return {"round": run.sample_rounds[seq], "text": d.text, "finish_reason": d.finish_reason, "tokens": d.tokens,
            "logprob": d.logprob, "tool_calls": d.tool_calls, "raw": run.raws[seq], "score": s.score,
            "confidence": s.confidence}


def _resume(saved: Mapping[str, list[dict[str, Any]]], progress: Mapping[str, Any]) -> Resume:
    samples = {q: [Drawn(Draw(d["text"], d["finish_reason"], d["tokens"], d["logprob"], tool_calls=d["tool_calls"]),
                         d["raw"], d["score"], d["confidence"], d["round"]) for d in rows] for q, rows in saved.items()}
    usage = progress.get("usage", {})
    return Resume(samples, Usage(usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)),
                  cancelled=progress.get("samples_cancelled", 0), rounds=progress.get("rounds", 0))


async def _result_json(result: RunResult, refs: list[str | None]) -> dict[str, Any]:
    """Per prompt: the answer, its votes, and ``allocation``: its samples started in each round
    (stream schedule: in each launch wave); then the summary."""
    rows = []
    correct = 0
    for run, ref in zip(result.runs, refs, strict=True):
        sel = run.selection
        per_round = [0] * result.rounds
        for r in run.sample_rounds:
            per_round[r - 1] += 1
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
