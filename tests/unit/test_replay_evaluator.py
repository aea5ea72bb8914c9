"""The replay evaluator: policies run through the engine on recorded samples."""

from __future__ import annotations

import pytest

from app.backends.replay import Problem
from app.replay import baselines
from app.replay.evaluator import ReplayConfigError, evaluate, resolve_policy


def problem(pid: str, answers: list[str | None], gold: str = "1", scores: list[float] | None = None) -> Problem:
    return Problem(id=pid, question=f"What is {pid}?", gold=gold, answers=tuple(answers),
                   correct=tuple(a == gold for a in answers), scores=None if scores is None else tuple(scores))


PROBLEMS = [
    problem("easy", ["1"] * 8),
    problem("hard", ["1", "2", "3", "2", "1", "4", "1", "1"]),
    problem("wrong", ["2"] * 7 + [None]),
    problem("rare", ["3", "3", "1", "3", "2", "3", "3", "3"]),
]


def test_uniform_allocator_through_the_engine_matches_the_numpy_baseline() -> None:
    report = evaluate(PROBLEMS, resolve_policy("uniform"), [1, 2, 4, 8], 5, resamples=50)
    for row, ref in zip(report.rows, report.uniform, strict=True):
        assert row.mean_samples == ref.mean_samples == row.budget
        assert row.accuracy == pytest.approx(ref.accuracy)
        assert row.coverage == pytest.approx(ref.coverage)
    # Uniform against itself: ratio 1 at one sample, never above 1 (the first crossing counts).
    assert report.efficiency[0] == pytest.approx(1.0)
    assert all(e is not None and e <= 1 + 1e-9 for e in report.efficiency)
    assert report.k == 8
    assert report.majority_at_k == pytest.approx(0.5)  # easy and hard; "wrong" and "rare" vote wrong


def test_ground_truth_elimination_stops_at_the_first_correct_sample() -> None:
    policy = resolve_policy("elimination", {"gamma": 0.5}, verifier="ground_truth")
    report = evaluate(PROBLEMS, policy, [8], 3, resamples=50)
    row, oracle = report.rows[0], report.oracle[0]
    assert row.coverage == pytest.approx(oracle.coverage) == pytest.approx(0.75)
    assert row.mean_samples < 8  # solved queries stop; only "wrong" uses its whole cap


def test_budget_is_never_overspent_and_counts_the_shared_pool() -> None:
    report = evaluate(PROBLEMS, resolve_policy("elimination"), [1.5, 3], 4, resamples=50)
    for row in report.rows:
        assert row.mean_samples <= row.budget + 1e-9


def test_per_query_policy_budget_is_its_cap() -> None:
    report = evaluate(PROBLEMS, resolve_policy("fixed"), [2, 16], 2, resamples=50)
    assert [r.mean_samples for r in report.rows] == [2.0, 8.0]  # 16 is capped by the 8 recorded samples
    assert report.per_query
    ac = evaluate([problem("easy", ["1"] * 8)], resolve_policy("adaptive_consistency"), [8], 2, resamples=50)
    assert ac.rows[0].mean_samples == 4  # Beta rule at 0.95 fires at 4 unanimous votes
    assert ac.rows[0].accuracy == 1.0


def test_builtin_policy_names_resolve() -> None:
    policy = resolve_policy("self-consistency-8")
    assert policy.spec.allocator == "fixed"
    assert policy.spec.params["n"] == 8


def test_scores_verifier_uses_recorded_scores() -> None:
    scored = [problem("s", ["2", "1", "2", "2"], scores=[-3.0, 4.0, -2.0, -1.0]),
              problem("t", ["1", "1", "2", "2"], scores=[2.0, 2.0, -1.0, -1.0])]
    policy = resolve_policy("fixed", {"n": 4}, aggregator="best_of_n", verifier="scores")
    report = evaluate(scored, policy, [4], 3, resamples=50)
    assert report.rows[0].accuracy == 1.0  # best-of-n picks the high-scored (correct) sample
    assert report.uniform[0].accuracy < 1.0


def test_scores_verifier_without_scores_is_a_clear_error() -> None:
    with pytest.raises(ReplayConfigError, match="scores"):
        evaluate(PROBLEMS, resolve_policy("elimination", verifier="scores"), [2], 1)


def test_confident_replays_with_recorded_likelihoods() -> None:
    import dataclasses

    # the correct answer comes with near-certain samples, the wrong ones with unlikely samples
    p = problem("w", ["2", "1", "3", "1", "2", "4"])
    p = dataclasses.replace(p, tokens=(20,) * 6, logprobs=(-0.2, -0.001, -0.3, -0.002, -0.2, -0.3))
    policy = resolve_policy("confident")
    assert policy.verifier == "likelihood" and policy.spec.aggregator == "weighted_majority"
    assert resolve_policy("confident", verifier="none").verifier == "none"
    report = evaluate([p], policy, [6], 10, resamples=20)
    assert report.rows[0].accuracy == 1.0  # a "1" sample weighs ~0.98, a wrong one ~0.02
    assert report.rows[0].mean_samples < 6  # one "1" settles it (lead >= 0.5)
    assert report.uniform[0].accuracy < 1.0
    with pytest.raises(ReplayConfigError, match="logprobs"):
        evaluate(PROBLEMS, policy, [2], 1)


@pytest.mark.parametrize(("name", "params", "match"), [
    ("nope", {}, "unknown policy"),
    ("elimination", {"bogus": 1}, "bogus"),
    ("fixed", {}, "needs a verifier"),
    # step search grows partial solutions: a file of whole samples cannot replay it (never a silent fixed-n)
    ("beam", {}, "searches step by step"),
    ("dvts", {}, "searches step by step"),
    ("particles", {}, "searches step by step"),
    ("beam-likelihood", {}, "searches step by step"),
    ("compute-optimal", {}, "searches step by step"),
    ("compute-optimal-likelihood", {}, "searches step by step"),
])
def test_bad_policies_are_config_errors(name: str, params: dict[str, object], match: str) -> None:
    aggregator = "best_of_n" if match == "needs a verifier" else None
    with pytest.raises(ReplayConfigError, match=match):
        resolve_policy(name, params, aggregator=aggregator)


def test_oracle_rows_use_the_same_draws() -> None:
    report = evaluate(PROBLEMS, resolve_policy("uniform"), [2], 3, resamples=50)
    sh = baselines.shuffle(PROBLEMS, [0, 1, 2])
    assert report.oracle[0].coverage == pytest.approx(baselines.oracle(baselines.first_correct(sh), 2).covered.mean())


def test_calibrated_learns_from_each_replayed_query_before_the_next() -> None:
    """Long traces: every sample scores exp(-0.005 * 300 / 3) ~ 0.61 under the built-in's temperature
    3, the right one; a fixed margin of 1.0 needs two agreeing samples, the margin learned from the
    first queries (their first score) needs one."""
    import dataclasses

    base = [dataclasses.replace(problem(f"q{i}", ["1"] * 8), tokens=(300,) * 8, logprobs=(-0.005,) * 8)
            for i in range(24)]
    policy = resolve_policy("calibrated", {"margin": 1.0, "min_history": 4})
    assert policy.verifier == "likelihood" and policy.verifier_params == {"temperature": 3.0}
    learned = evaluate(base, policy, [8], 2, resamples=20).rows[0]
    fixed = evaluate(base, resolve_policy("calibrated", {"margin": 1.0, "min_history": 256}), [8], 2,
                     resamples=20).rows[0]
    assert fixed.mean_samples == 2.0  # the lead reaches 1.0 at the second sample (2 x 0.61)
    assert learned.mean_samples == pytest.approx((4 * 2 + 20 * 1) / 24)  # 4 queries of warm-up, then one each
    assert learned.accuracy == fixed.accuracy == 1.0


def test_the_stream_schedule_with_priority_tokens_replays_without_speculation() -> None:
    """On the recorded thinking traces: ``calibrated`` asks for one sample at a time, so without
    speculation the stream schedule spends what rounds spend, sample for sample; with it (an idle
    service, the live default) it starts the samples its queries usually need at once and spends more."""
    from app.backends.replay import load_problems
    from app.config import REPO_ROOT

    problems = load_problems(REPO_ROOT / "data" / "demo-thinking-n16.jsonl")
    lean = resolve_policy("calibrated", schedule="stream", priority="tokens")
    assert lean.spec.schedule is not None and not lean.spec.schedule.speculate
    assert resolve_policy("calibrated", schedule="stream").spec.schedule.speculate  # type: ignore[union-attr]
    runs = {name: evaluate(problems, policy, [16], 2, resamples=20)
            for name, policy in (("lean", lean), ("rounds", resolve_policy("calibrated")),
                                 ("wide", resolve_policy("calibrated", schedule="stream", priority="latency")))}
    lean_row, rounds_row, wide_row = (runs[n].rows[0] for n in ("lean", "rounds", "wide"))
    assert lean_row.tokens == rounds_row.tokens and lean_row.mean_samples == rounds_row.mean_samples
    assert wide_row.tokens is not None and lean_row.tokens is not None and wide_row.tokens > 1.1 * lean_row.tokens
    assert runs["wide"].costs[0]["steps_p50"] < runs["lean"].costs[0]["steps_p50"]  # what the tokens buy
