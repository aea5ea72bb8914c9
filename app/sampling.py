"""Parallel sampling: whole samples drawn side by side, the allocator deciding how many and when to stop.

The strategy of every allocation policy (:class:`ParallelSampling`, a :class:`~app.engine.Strategy`).
Its loop:

1. ``plan = allocator.plan(states, Budget(samples_left, tokens_left))``. ``plan[q]`` is how many
   more samples query ``q`` needs beyond its finished ones, the ones in flight included
   (``QueryState.in_flight``): :func:`fit` starts ``plan[q] - in_flight`` new ones, never past the
   query's cap, the shared sample budget (samples started count, finished or not) or, in the stream
   schedule, the schedule's load-aware ``width`` per query and the engine's ``max_in_flight`` per run.
   With a token budget every started sample gets ``max_tokens`` such that what all in-flight samples
   may still generate (plus the verifier's reserve) fits in what is left: tokens are never overspent.
2. **rounds** (``Schedule.mode``): each planned query gets one ``n=k`` call (shared prompt prefix)
   and the loop waits for every call of the round before planning again (a barrier).
   **stream**: the new samples of a query are one streamed ``n=k`` call (one prefill, as in rounds;
   a probed trace, which may be stopped alone, is a call of its own; a monitored query's traces are cut
   one by one inside the engine), each sample delivered the moment it finishes; the allocator is
   asked again at every delivery (so more samples start while others still run), and a query it
   calls :meth:`~allocators.Allocator.finished` has its in-flight calls cancelled (their streams
   closed, the tokens they had generated billed).

The loop ends when nothing is in flight and nothing more is planned, a budget is spent, or the
deadline passes.
"""

from __future__ import annotations

from allocators import Budget
from app.run import Run


class ParallelSampling:
    """The parallel-sampling strategy (see the module doc); stateless, one instance serves every run."""

    async def run(self, run: Run) -> str:
        while True:
            if run.deadline_passed():
                return "deadline"
            if run.stream or not len(run.flights):
                reason = await launch(run)
                if reason is not None and not len(run.flights):
                    return reason
            done = await run.wait()
            if not done:
                return "deadline"
            touched = run.take(done)
            if run.stream and touched:  # a query is finished (or not) on its finished samples alone
                finished = run.parts.allocator.finished
                # a call whose samples all came is ending (its usage, prompt tokens included, is next)
                over = [f for f in run.flights.flights()
                        if f.pending and f.run_id in touched and finished(run.by_id[f.run_id].state)]
                if over:
                    await run.cancel(over)
            if run.stream or not len(run.flights):
                await run.notify()


SAMPLING = ParallelSampling()


async def launch(run: Run) -> str | None:
    """Ask the allocator and start what it planned (one launch wave); the stop reason when nothing
    was started."""
    samples_left, tokens_free = run.samples_left(), run.tokens_free()
    if samples_left is not None and samples_left <= 0:
        return "budget"
    if tokens_free is not None and tokens_free < 1 + run.reserve:
        return "tokens"
    plan, asked = fit(run, ask(run), samples_left)
    if not plan:
        return stop_reason(run)
    per_sample: int | None = None
    if tokens_free is not None:
        plan = fit_tokens(plan, tokens_free, run.reserve)
        if not plan:
            return "tokens"
        per_sample = (tokens_free - sum(plan.values()) * run.reserve) // sum(plan.values())
    run.rounds += 1
    for qid, k in plan.items():
        run.by_id[qid].speculative += max(0, k - asked.get(qid, 0))
        await start(run, qid, k, per_sample)
    return None


def stop_reason(run: Run) -> str:
    """Why nothing more is planned: ``cap`` when every query is at its cap; for a single query, what
    its allocator says (``cap``, ``no_answer``, ``no_agreement``, ``policy``); else ``policy``."""
    if all(r.state.room == 0 for r in run.runs):
        return "cap"
    if len(run.runs) == 1:
        return run.parts.allocator.stop_reason(run.runs[0].state)
    return "policy"


def ask(run: Run) -> dict[str, int]:
    """The allocator's plan, each query's in-flight samples set first; the budget it plans against
    counts in-flight samples as not yet spent (they are part of what it plans)."""
    flying = run.in_flight()
    states = [r.state for r in run.runs]
    for st in states:
        st.in_flight = flying.get(st.id, 0)
    in_flight = sum(flying.values())
    samples, tokens = run.limits.samples, run.limits.tokens
    budget = Budget(None if samples is None else samples - run.started + in_flight,
                    None if tokens is None else tokens - run.tokens)
    return run.parts.allocator.plan(states, budget)


def fit(run: Run, wanted: dict[str, int], samples_left: int | None) -> tuple[dict[str, int], dict[str, int]]:
    """New samples per query: what the allocator wants beyond the query's in-flight ones, within its
    room and (stream) the load-aware width; raised, while the backends are idle, to the policy's
    speculation target (:meth:`~app.engine.Engine.speculation`: about what its queries usually need,
    started at once, within the allocator's own cap); then the shared sample budget and the run's
    free in-flight slots, taken in plan order (the allocator's priority), whatever the allocator
    returned. Speculative samples are cancelled with the rest once the allocator calls the query
    decided. Also returns, per query, how many of its new samples the allocator itself asked for."""
    width = run.engine.width(run.parts.schedule.width) if run.stream else None
    own = run.parts.allocator.own_cap
    plan: dict[str, int] = {}
    asked_new: dict[str, int] = {}
    for qid, k in wanted.items():
        q = run.by_id.get(qid)
        if q is None:
            continue
        st = q.state
        target = min(int(k), st.room)
        if width is not None:
            target = min(target, width)
        asked = target
        # a monitored query speculates once its cut threshold is known: a trace started before is never cut
        spec = run.engine.speculation(run.spec_key, st.spent) if run.spec_key is not None and target > 0 and (
            run.monitor is None or run.parts.allocator.cut_below(st) is not None) else 0
        if spec > st.spent and target > 0:
            limit = st.room if own is None else min(st.room, own - st.spent)
            target = max(target, min(spec - st.spent, limit, width or limit))
        if target > st.in_flight:
            plan[qid] = target - st.in_flight
            asked_new[qid] = max(0, asked - st.in_flight)
    slots = run.engine.max_in_flight - sum(q.state.in_flight for q in run.runs) if run.stream else None
    left = samples_left if slots is None else slots if samples_left is None else min(samples_left, slots)
    if left is None:
        return plan, asked_new
    out: dict[str, int] = {}
    for qid, k in plan.items():
        k = min(k, left)
        left -= max(k, 0)
        if k > 0:
            out[qid] = k
    return out, asked_new


def fit_tokens(plan: dict[str, int], tokens_left: int, reserve: int) -> dict[str, int]:
    """Drop samples from the end of the plan until every sample can get >= 1 token (+ reserve)."""
    excess = sum(plan.values()) - tokens_left // (1 + reserve)
    if excess <= 0:
        return plan
    out = dict(plan)
    for qid in reversed(list(out)):
        take = min(out[qid], excess)
        out[qid] -= take
        excess -= take
        if out[qid] == 0:
            del out[qid]
        if excess == 0:
            break
    return out


async def start(run: Run, qid: str, k: int, per_sample: int | None) -> None:
    """Start ``k`` samples of one query: one call (rounds: ``n=k``; stream: one streamed ``n=k`` call,
    or ``k`` one-sample calls when traces are probed, since a trace may be stopped alone). Under a
    token budget each sample gets ``min(per_sample, its max_tokens)`` and holds that plus the
    verifier's reserve."""
    q = run.by_id[qid]
    req = run.request_for(q)
    limit = int(req.params.get("max_tokens") or run.engine.default_max_tokens)
    max_tokens = None if per_sample is None else min(per_sample, limit)
    held = 0 if per_sample is None else (max_tokens or limit) + run.reserve
    q.rounds += 1
    for n in [1] * k if run.solo else [k]:
        salt: int | str = f"s{q.started}" if run.stream else run.rounds
        await run.launch(q, req, n, max_tokens=max_tokens, held=held, seed=run.call_seed(q, salt),
                         streamed=run.stream)
