"""Property tests of the production loop: any policy, params and budgets run through the engine (not the
offline simulator) never draw more samples than the sample budget nor spend more completion tokens
than the token budget (the tokens of every sample counted, the last ones cut to fit), never pass a
query's cap, and always end."""

from __future__ import annotations

import contextlib
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocators import create
from app.aggregators import create_aggregator
from app.backends.base import Draw, DrawResult, SampleSource, SamplingRequest, Usage
from app.engine import Drawn, Engine, Query, Resume, RoundEvent, RunLimits
from app.policy import PolicyParts, Schedule
from app.run import speculation_key
from tests.unit.test_alloc_properties import PARAMS, Scenario, scenarios


class ModelSource(SampleSource):
    """Draws from each query's answer model; a sample costs ``tokens`` unless ``max_tokens`` cuts it
    (then it is truncated, as a backend would)."""

    inline = True

    def __init__(self, sc: Scenario) -> None:
        self.sc = sc
        self.rng = random.Random(sc.seed)
        self.drawn: dict[str, int] = {}

    def why_not_cutting(self, model: str) -> str | None:
        return None  # as an engine that cuts: no sample of this model falls under a threshold

    async def draw(self, request: SamplingRequest, n: int, *, seed: int | None = None,
                   max_tokens: int | None = None) -> DrawResult:
        q = self.sc.queries[int(request.query_id or "0")]
        tokens = self.sc.tokens_per_sample if max_tokens is None else min(self.sc.tokens_per_sample, max_tokens)
        draws = []
        for _ in range(n):
            right = self.rng.random() < q.p_right
            answer = "7" if right else str(8 + self.rng.randrange(q.n_wrong))
            finish = "length" if tokens < self.sc.tokens_per_sample else "stop"
            draws.append(Draw(text=f"The answer is {answer}.", finish_reason=finish, tokens=tokens))
        self.drawn[request.query_id or ""] = self.drawn.get(request.query_id or "", 0) + n
        return DrawResult(draws, Usage(1, tokens * n))


@pytest.mark.parametrize("mode", ["rounds", "stream"])
@pytest.mark.parametrize("name", sorted(PARAMS))
@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), sc=scenarios, width=st.integers(1, 8), need=st.integers(0, 12))
async def test_engine_runs_keep_every_budget(name: str, mode: str, data: st.DataObject, sc: Scenario,
                                             width: int, need: int) -> None:
    """``need``: what the policy's queries needed lately (0: unknown), so the stream schedule starts
    samples beyond what the allocator asks for (speculation): budgets and caps hold all the same."""
    params: dict[str, Any] = data.draw(PARAMS[name], label="params")
    if name == "adaptive_consistency":
        params["min_samples"] = min(params["min_samples"], params["max_samples"])
    allocator = create(name, {**params, "tokens_per_sample": sc.tokens_per_sample}, random.Random(sc.seed))
    parts = PolicyParts(allocator, create_aggregator("majority"), None, schedule=Schedule(mode, width))  # type: ignore[arg-type]
    queries = [Query(str(i), SamplingRequest("completion", "m", prompt=f"q{i}", query_id=str(i)), cap=q.cap)
               for i, q in enumerate(sc.queries)]
    source = ModelSource(sc)
    engine = Engine(source)
    if need:
        engine.learn_need(speculation_key(parts), need)
    result = await engine.run(queries, parts, RunLimits(samples=sc.samples, tokens=sc.tokens), seed=sc.seed)
    started = result.samples_drawn + result.samples_cancelled
    assert result.speculative <= started
    if sc.samples is not None:
        assert started <= sc.samples  # cancelled samples count: they were started
    if sc.tokens is not None:
        # every sample's tokens, truncated and cancelled ones included
        assert result.usage.completion_tokens <= sc.tokens
    for run, q in zip(result.runs, sc.queries, strict=True):
        assert run.state.spent + run.cancelled <= q.cap
        assert run.state.spent + run.cancelled == source.drawn.get(run.query.id, 0)
        assert run.state.spent == len(run.draws)
    assert result.samples_drawn == sum(r.state.spent for r in result.runs)
    assert result.usage.completion_tokens == sum(s.tokens for r in result.runs for s in r.state.samples) + sum(
        r.cancelled_tokens for r in result.runs)
    # replay's clock: a query that drew anything took at least one token step
    assert all(r.steps >= 1 for r in result.runs if r.state.spent + r.cancelled)


class Interrupted(Exception):
    pass


@pytest.mark.parametrize("mode", ["rounds", "stream"])
@pytest.mark.parametrize("name", ["uniform", "greedy", "elimination", "adaptive_consistency"])
@settings(max_examples=25, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), sc=scenarios, width=st.integers(1, 8), stop_at=st.integers(1, 12))
async def test_a_run_resumed_from_any_checkpoint_keeps_every_budget(name: str, mode: str, data: st.DataObject,
                                                                    sc: Scenario, width: int, stop_at: int) -> None:
    """A run interrupted after any event and resumed from what it had delivered (a batch taken over)
    keeps the checkpointed samples first, in order, and never passes a budget or a cap overall."""
    params: dict[str, Any] = data.draw(PARAMS[name], label="params")
    if name == "adaptive_consistency":
        params["min_samples"] = min(params["min_samples"], params["max_samples"])

    def parts() -> PolicyParts:
        allocator = create(name, {**params, "tokens_per_sample": sc.tokens_per_sample}, random.Random(sc.seed))
        return PolicyParts(allocator, create_aggregator("majority"), None, schedule=Schedule(mode, width))  # type: ignore[arg-type]

    queries = [Query(str(i), SamplingRequest("completion", "m", prompt=f"q{i}", query_id=str(i)), cap=q.cap)
               for i, q in enumerate(sc.queries)]
    limits = RunLimits(samples=sc.samples, tokens=sc.tokens)
    saved: list[Resume] = []

    async def crash(event: RoundEvent) -> None:
        saved.append(Resume(
            {r.query.id: [Drawn(d, raw, s.score, s.confidence)
                          for d, raw, s in zip(r.draws, r.raws, r.state.samples, strict=True)] for r in event.runs},
            Usage(event.usage.prompt_tokens, event.usage.completion_tokens), event.samples_cancelled, event.round))
        if len(saved) == stop_at:
            raise Interrupted

    with contextlib.suppress(Interrupted):
        await Engine(ModelSource(sc)).run(queries, parts(), limits, seed=sc.seed, on_round=crash)
    checkpoint = saved[-1] if saved else None
    result = await Engine(ModelSource(sc)).run(queries, parts(), limits, seed=sc.seed, resume=checkpoint)
    if sc.samples is not None:
        assert result.samples_drawn + result.samples_cancelled <= sc.samples
    if sc.tokens is not None:
        assert result.usage.completion_tokens <= sc.tokens
    for run, q in zip(result.runs, sc.queries, strict=True):
        assert run.state.spent <= q.cap
        before = checkpoint.samples.get(run.query.id, []) if checkpoint else []
        assert [d.draw for d in before] == run.draws[: len(before)]
    assert result.samples_drawn == sum(r.state.spent for r in result.runs)
