"""Correctness of answered requests against the gold answer, scored after the level (off the timed
path).

The answer of a request is the service's ``ttc.answer`` when present (the voted answer), else
:func:`app.answers.extract_answer` on the returned text (peers and plain backends). It matches when
:func:`app.answers.equivalent` says so (plain numbers exactly, anything else via math-verify).
math-verify runs with its signal timeouts disabled, so scoring runs in one daemon thread bounded
by ``timeout_s`` in total; records not reached by then are marked incorrect and counted.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from app.answers import equivalent, extract_answer
from ttc_tools.loadtest.records import RequestRecord


def answer_of(rec: RequestRecord) -> str | None:
    if rec.answer:
        return rec.answer
    return extract_answer(rec.content) if rec.content else None


def score_one(rec: RequestRecord) -> bool:
    """Whether ``rec`` answered its gold answer (a failed request never does)."""
    if rec.error is not None or rec.gold is None:
        return False
    try:
        return equivalent(rec.gold, answer_of(rec))
    except Exception:
        return False


def score_records(records: Sequence[RequestRecord], *, timeout_s: float = 60.0) -> int:
    """Set ``correct`` on every record with a gold answer; return how many timed out unscored."""
    todo = [r for r in records if r.gold is not None]
    results: dict[int, bool] = {}

    def work() -> None:
        for i, rec in enumerate(todo):
            results[i] = score_one(rec)

    thread = threading.Thread(target=work, name="loadtest-scoring", daemon=True)
    thread.start()
    thread.join(timeout_s)
    for i, rec in enumerate(todo):
        rec.correct = results.get(i, False)
    return len(todo) - len(results)
