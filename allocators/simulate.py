"""Drive an allocator offline, the way the engine does: plan, draw, update, repeat.

Used by tests, the benchmark and offline replays. ``draw(state, k)`` supplies ``k`` new samples for a
query (from recorded samples, a model of answers, ...); the loop applies the budgets like the engine:
it stops when the plan is empty or the budget is spent, checks every plan against the contract, and
clips each sample's tokens to what the token budget has left (the engine shrinks ``max_tokens``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from .base import Allocator, Budget, Plan, QueryState, Sample
from .budgeting import check_plan

Draw = Callable[[QueryState, int], Sequence[Sample]]


@dataclass(slots=True)
class Trace:
    """What a simulated run did: every round's plan and the totals spent."""

    plans: list[Plan] = field(default_factory=list)
    samples: int = 0
    tokens: int = 0
    stop: str = ""

    @property
    def rounds(self) -> int:
        return len(self.plans)


def run(
    allocator: Allocator,
    states: Sequence[QueryState],
    budget: Budget,
    draw: Draw,
    *,
    max_rounds: int = 100_000,
) -> Trace:
    """Run rounds until the plan is empty, the budget is spent or ``max_rounds`` pass.

    ``stop`` says why: ``policy`` (empty plan), ``budget``, ``tokens`` or ``rounds``. Raises
    :class:`~allocators.errors.PlanError` for a plan that breaks the contract.
    """
    trace = Trace()
    by_id = {st.id: st for st in states}
    for _ in range(max_rounds):
        left = Budget(
            samples=None if budget.samples is None else budget.samples - trace.samples,
            tokens=None if budget.tokens is None else budget.tokens - trace.tokens,
        )
        if left.samples is not None and left.samples <= 0:
            trace.stop = "budget"
            return trace
        if left.tokens is not None and left.tokens <= 0:
            trace.stop = "tokens"
            return trace
        plan = allocator.plan(states, left)
        if not plan:
            trace.stop = "policy"
            return trace
        check_plan(plan, states, left)
        trace.plans.append(dict(plan))
        for qid, k in plan.items():
            st = by_id[qid]
            for s in draw(st, k):
                if budget.tokens is not None:
                    s = replace(s, tokens=max(0, min(s.tokens, budget.tokens - trace.tokens)))
                st.samples.append(s)
                trace.samples += 1
                trace.tokens += s.tokens
    trace.stop = "rounds"
    return trace
