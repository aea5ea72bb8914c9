"""Recorded traffic: served samples written to the store, exported in the replay schema.

After a request is served, :meth:`Recorder.submit_run` queues one row per answered query (prompt,
canonical answers, verifier scores, token counts, mean logprobs, latency, policy name/version); a
background task writes the queue in batches, so recording never delays a response (when the queue
is full, rows are dropped and counted). Whether a request is recorded: the policy's ``record`` flag
when set, else ``recording.enabled``.

:func:`export_jsonl` writes one replay problem per recorded query (the schema ``ttc replay`` and the
replay backend read): ``id``, ``question``, ``gold`` (the request's ``ttc.reference``, else null),
``answers``, ``correct`` (each answer checked against the reference; with no reference all false and
``meta.correct_unknown: true``), ``scores`` (when every sample was scored), ``tokens``,
``logprobs`` (when every sample has one), ``traces`` (when every sample came with top log-probs per
token: its token confidences, :func:`app.confidence.encode_trace`, over ``meta.trace_top_k``
alternatives; what ``deepconf`` replays from), and ``meta`` (policy, version, model, latency, ...).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.answers import equivalent
from app.backends.base import Draw
from app.confidence import encode_trace, token_confidences, token_top_logprobs
from app.config import RecordingConfig
from app.engine import RunResult
from app.policy import PolicySnapshot
from app.store.repo import Store

log = logging.getLogger("ttc.recording")


def recording_rows(snapshot: PolicySnapshot, model: str | None, request_id: str, result: RunResult,
                   latency_s: float, *, key_id: str | None = None, store_texts: bool = False) -> list[dict[str, Any]]:
    """One row per query of a run (a batch gives several, ids ``<request_id>:<query id>`` on export)."""
    now = time.time()
    rows = []
    for run in result.runs:
        samples = run.state.samples
        kind = run.query.request.kind
        traces = _traces(run.draws, kind)
        rows.append({
            "created_at": now, "request_id": request_id, "query_id": run.query.id,
            "policy_name": snapshot.name, "policy_version": snapshot.version, "model": model,
            "key_id": key_id, "question": run.query.request.prompt_text(), "reference": run.query.reference,
            "answers": [s.answer for s in samples], "scores": [s.score for s in samples],
            "tokens": [s.tokens for s in samples], "logprobs": [s.logprob for s in samples],
            "texts": [d.text for d in run.draws] if store_texts else None,
            "traces": traces,
            "selected": run.selection.index if run.selection else None,
            "latency_ms": round(latency_s * 1000, 3),
            "meta": {"stop_reason": result.stop_reason, "rounds": run.rounds, "partial": result.partial,
                     **({"trace_top_k": _trace_top_k(run.draws, kind)} if traces else {})},
        })
    return rows


def _traces(draws: Sequence[Draw], kind: str) -> list[str] | None:
    """Each sample's token-confidence trace (:func:`app.confidence.encode_trace`), when every sample
    came with top log-probs per token."""
    traces = []
    for d in draws:
        values = token_confidences(d.logprobs, kind)
        if values is None:
            return None
        traces.append(encode_trace(values))
    return traces or None


def _trace_top_k(draws: Sequence[Draw], kind: str) -> int | None:
    tops = token_top_logprobs(draws[0].logprobs, kind) if draws else []
    return len(tops[0]) if tops else None


class Recorder:
    """Queues recordings and writes them in the background (start/close in the app lifespan)."""

    def __init__(self, store: Store, config: RecordingConfig) -> None:
        self.store = store
        self.config = config
        self.dropped = 0
        self._queue: asyncio.Queue[list[dict[str, Any]]] = asyncio.Queue(maxsize=config.queue_size)
        self._task: asyncio.Task[None] | None = None

    def wants(self, snapshot: PolicySnapshot) -> bool:
        flag = snapshot.spec.record
        return self.config.enabled if flag is None else flag

    def submit_run(self, snapshot: PolicySnapshot, model: str | None, request_id: str, result: RunResult,
                   latency_s: float, key_id: str | None = None) -> None:
        """Queue a finished run (a single request or a batch) if its policy is recorded; never blocks."""
        if not self.wants(snapshot) or not result.runs:
            return
        try:
            self._queue.put_nowait(recording_rows(snapshot, model, request_id, result, latency_s, key_id=key_id,
                                                  store_texts=self.config.store_texts))
        except asyncio.QueueFull:
            self.dropped += 1

    def start(self) -> None:
        self._task = asyncio.create_task(self._writer())

    async def _writer(self) -> None:
        while True:
            items = [await self._queue.get()]
            while not self._queue.empty() and len(items) < 500:
                items.append(self._queue.get_nowait())
            try:
                await self.store.add_recordings([row for rows in items for row in rows])
            except Exception:
                log.exception("could not write %d recording(s)", len(items))
            finally:
                for _ in items:
                    self._queue.task_done()

    async def flush(self) -> None:
        """Return when everything queued so far is written (tests, shutdown)."""
        if self._task is not None and not self._task.done():
            await self._queue.join()
            return
        rows = []
        while not self._queue.empty():
            rows.extend(self._queue.get_nowait())
            self._queue.task_done()
        await self.store.add_recordings(rows)

    async def close(self) -> None:
        await self.flush()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


def _all_or_none(values: Sequence[Any]) -> list[Any] | None:
    return list(values) if values and all(v is not None for v in values) else None


def to_replay(row: dict[str, Any]) -> dict[str, Any]:
    """One recorded query as one replay-schema problem."""
    answers = list(row["answers"])
    gold = row.get("reference")
    meta: dict[str, Any] = {
        "source": "ttc-recording", "policy": row["policy_name"], "policy_version": row["policy_version"],
        "model": row.get("model"), "request_id": row["request_id"], "latency_ms": row["latency_ms"],
        "recorded_at": row["created_at"], "selected": row.get("selected"), **(row.get("meta") or {}),
    }
    if gold is None:
        correct = [False] * len(answers)
        meta["correct_unknown"] = True
    else:
        correct = [a is not None and equivalent(gold, a) for a in answers]
    out: dict[str, Any] = {
        "id": row["request_id"] if row["query_id"] == "q0" else f"{row['request_id']}:{row['query_id']}",
        "question": row["question"], "gold": gold, "answers": answers, "correct": correct,
        "tokens": list(row.get("tokens") or [0] * len(answers)),
    }
    for name, values in (("scores", row.get("scores")), ("logprobs", row.get("logprobs")),
                         ("texts", row.get("texts")), ("traces", row.get("traces"))):
        kept = _all_or_none(values or [])
        if kept is not None:
            out[name] = kept
    out["meta"] = meta
    return out


async def export_jsonl(store: Store, out: Path, *, since: float | None = None, until: float | None = None,
                       policy: str | None = None) -> int:
    """Write recordings to ``out`` (JSON lines, replay schema); returns the number of problems."""
    rows = await store.recordings(since=since, until=until, policy=policy)
    out.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(out, "w", encoding="utf-8") as fh:
        for row in rows:
            if not row["answers"]:
                continue
            fh.write(json.dumps(to_replay(row), ensure_ascii=False) + "\n")
            n += 1
    return n
