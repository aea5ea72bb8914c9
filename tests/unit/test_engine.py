"""The engine loop defends budgets whatever the allocator asks, and replay draws are per-seed shuffles."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import pytest

from allocators import Allocator, AllocatorParams, Budget, QueryState
from app.aggregators import create_aggregator
from app.backends.base import Draw, DrawResult, SampleSource, SamplingRequest, Usage
from app.backends.replay import Problem, ReplaySource
from app.engine import Engine, Query, RunLimits, derive_seed
from app.policy import PolicyParts


class Greedy(Allocator):
    """A rogue allocator: always asks for far more than anyone may have."""

    name = "greedy-test"

    def plan(self, states: Sequence[QueryState], budget: Budget) -> dict[str, int]:
        return {s.id: 1000 for s in states}


class CountingSource(SampleSource):
    def __init__(self, tokens: int = 7) -> None:
        self.calls: list[tuple[str, int, int | None]] = []
        self.tokens = tokens

    async def draw(self, request: SamplingRequest, n: int, *, seed: int | None = None,
                   max_tokens: int | None = None) -> DrawResult:
        self.calls.append((request.query_id or "", n, max_tokens))
        per = min(self.tokens, max_tokens) if max_tokens else self.tokens
        draws = [Draw(text=f"The answer is {i % 2}.", tokens=per) for i in range(n)]
        return DrawResult(draws, Usage(3, per * n))


def parts() -> PolicyParts:
    return PolicyParts(Greedy(AllocatorParams(), random.Random(0)), create_aggregator("majority"), None)


def queries(n: int, cap: int) -> list[Query]:
    return [Query(str(i), SamplingRequest("completion", "m", prompt=f"q{i}", query_id=str(i)), cap=cap)
            for i in range(n)]


async def test_caps_and_shared_budget_hold_against_a_rogue_allocator() -> None:
    source = CountingSource()
    result = await Engine(source).run(queries(3, cap=5), parts(), RunLimits(samples=11))
    assert result.samples_drawn == 11
    assert all(r.state.spent <= 5 for r in result.runs)
    assert result.stop_reason == "budget"


async def test_token_budget_shrinks_max_tokens_and_is_never_overspent() -> None:
    source = CountingSource(tokens=50)
    result = await Engine(source).run(queries(2, cap=10), parts(), RunLimits(tokens=100))
    assert result.usage.completion_tokens <= 100
    assert all(max_tokens is not None and max_tokens * n <= 100 for _, n, max_tokens in source.calls)
    assert result.stop_reason in ("tokens", "cap")


def test_derived_seeds_are_stable_and_distinct() -> None:
    assert derive_seed(1, "q", 1) == derive_seed(1, "q", 1)
    assert len({derive_seed(1, "q", r) for r in range(50)}) == 50
    assert derive_seed(1, "q", 1) != derive_seed(2, "q", 1)


@pytest.mark.parametrize("seed", [0, 1, 2])
async def test_replay_source_hands_out_a_per_seed_shuffle(seed: int) -> None:
    p = Problem("a", "q", "1", tuple(str(i) for i in range(10)), tuple(i == 3 for i in range(10)))
    src = ReplaySource([p], seed)
    req = SamplingRequest("completion", "replay", prompt="q", query_id="a")
    first = await src.draw(req, 4)
    rest = await src.draw(req, 10)
    got = [d.answer for d in first.draws + rest.draws]
    assert sorted(got, key=int) == [str(i) for i in range(10)]  # every sample once, never more
    again = ReplaySource([p], seed)
    assert [d.answer for d in (await again.draw(req, 10)).draws] == got
    assert [d.correct for d in first.draws + rest.draws].count(True) == 1


class LogprobSource(SampleSource):
    """Records whether each call asked for log-probs; answers with a fixed mean log-prob."""

    def __init__(self) -> None:
        self.asked: list[bool] = []

    async def draw(self, request: SamplingRequest, n: int, *, seed: int | None = None,
                   max_tokens: int | None = None) -> DrawResult:
        self.asked.append(bool(request.params.get("logprobs")))
        return DrawResult([Draw(text="The answer is 4.", tokens=10, logprob=-0.001) for _ in range(n)],
                          Usage(3, 10 * n))


async def test_a_verifier_that_needs_logprobs_gets_them_without_changing_the_request() -> None:
    from allocators import Margin, MarginParams
    from app.verifiers import create_verifier

    source = LogprobSource()
    confident = PolicyParts(Margin(MarginParams(), random.Random(0)), create_aggregator("weighted_majority"),
                            create_verifier("likelihood"))
    qs = queries(1, cap=12)
    result = await Engine(source).run(qs, confident, RunLimits())
    assert source.asked == [True]
    assert "logprobs" not in qs[0].request.params  # the client's request is left as it was
    run = result.runs[0]
    assert run.state.spent == 1  # one sample with probability exp(-0.01) >= 0.5 settles it
    assert run.state.samples[0].score == pytest.approx(math.exp(-0.01))

    plain = await Engine(source).run(queries(1, cap=3), parts(), RunLimits())
    assert plain.samples_drawn == 3 and source.asked[1:] == [False]


def test_speculation_starts_the_median_need_of_queries_still_undecided() -> None:
    """What a policy's queries needed: 1 for six of ten, 10 for four. A fresh query starts the median
    (1); one still undecided after a sample is one of the hard ones: it starts up to 10 at once."""
    engine = Engine(CountingSource())
    assert engine.speculation("p", 0) == 0  # nothing learned yet
    for need in [1, 10, 1, 1, 10, 1, 10, 1, 10, 1]:
        engine.learn_need("p", need)
    assert engine.speculation("p", 0) == 1
    assert engine.speculation("p", 1) == 10
    assert engine.speculation("p", 10) == 0  # past every need seen: the allocator's own plan
    engine.capacity, engine.streaming = 100, 50  # half the stream capacity in flight: half the extra
    assert engine.speculation("p", 1) == 1 + math.ceil(9 * 0.5)


def test_old_needs_fade() -> None:
    engine = Engine(CountingSource())
    for _ in range(20):
        engine.learn_need("p", 10)
    for _ in range(60):
        engine.learn_need("p", 2)
    assert engine.speculation("p", 0) == 2  # the recent queries need 2
