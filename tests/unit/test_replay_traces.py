"""DeepConf offline: recorded token-confidence traces cut where the engine's monitor would cut them."""

from __future__ import annotations

import dataclasses

import pytest

from app.backends.replay import Problem, ReplayFormatError, parse_problem
from app.confidence import TRACE_STEP, decode_trace, encode_trace, token_confidences, trace_logprobs
from app.replay.evaluator import ReplayConfigError, evaluate, resolve_policy

SURE = [12.0] * 40
DROPS = [12.0] * 10 + [5.0] * 30  # lowest group confidence 5: below a threshold of 6 from token 24 on


def problem(pid: str, right: int, wrong: int, top_k: int = 5) -> Problem:
    answers = ("1",) * right + ("2",) * wrong
    traces = (encode_trace(SURE),) * right + (encode_trace(DROPS),) * wrong
    return Problem(id=pid, question=f"What is {pid}?", gold="1", answers=answers,
                   correct=tuple(a == "1" for a in answers), tokens=(40,) * len(answers),
                   traces=traces, meta={"trace_top_k": top_k})


PROBLEMS = [problem(f"p{i}", 3, 9) for i in range(6)]
DEEPCONF = {"fixed": 6.0, "max_samples": 12, "window": 16, "top_k": 5, "give_up_after": 0}
"""A fixed threshold (the online one is set by each query's warmup traces, below), and no giving up
after three traces without a vote: here those are cut traces, not answerless ones."""


def test_traces_round_trip_at_their_resolution_and_clip() -> None:
    values = [0.0, 0.04, 3.14159, 12.0, 25.5, 40.0]
    back = decode_trace(encode_trace(values))
    assert back[:5] == pytest.approx(values[:5], abs=TRACE_STEP / 2) and back[5] == pytest.approx(25.5)
    assert token_confidences(trace_logprobs(back, "chat"), "chat") == pytest.approx(back)
    with pytest.raises(ValueError):
        decode_trace("not base64!")


def test_a_file_with_traces_names_their_top_k_and_holds_base64() -> None:
    rec = {"id": "a", "answers": ["1"], "correct": [True], "traces": [encode_trace(SURE)]}
    with pytest.raises(ReplayFormatError, match="trace_top_k"):
        parse_problem(rec, "f:1")
    with pytest.raises(ReplayFormatError, match="base64"):
        parse_problem({**rec, "traces": ["%%%"], "meta": {"trace_top_k": 5}}, "f:1")
    assert parse_problem({**rec, "meta": {"trace_top_k": 5}}, "f:1").traces == (encode_trace(SURE),)


def test_replay_cuts_the_traces_whose_confidence_drops_where_the_engine_would_and_they_do_not_vote() -> None:
    uncut = evaluate(PROBLEMS, resolve_policy("deepconf", {**DEEPCONF, "fixed": 0.0}, schedule="stream"), [12], 5,
                     resamples=20)
    for schedule in ("stream", "rounds"):  # the engine cuts a call's traces whatever the schedule
        cut = evaluate(PROBLEMS, resolve_policy("deepconf", DEEPCONF, schedule=schedule), [12], 5, resamples=20)
        # a dropping trace is cut at token 24 (the 16-token window's mean (2 * 12 + 14 * 5) / 16 < 6)
        assert cut.costs[0]["cut"] > 0 and uncut.costs[0]["cut"] == 0
        assert cut.costs[0]["tokens"] < uncut.costs[0]["tokens"]
        # cut traces do not vote: the three sure "1"s win; uncut, nine unsure "2"s (weight 5 each) often do
        assert cut.rows[0].accuracy == 1.0 and uncut.rows[0].accuracy < 1.0


def test_online_threshold_from_warmup_traces_cuts_later_ones() -> None:
    online = {"warmup": 4, "keep": 10, "max_samples": 12}  # DeepConf-low: the 90th percentile
    stream = evaluate(PROBLEMS, resolve_policy("deepconf", online, schedule="stream"), [12], 5, resamples=20)
    uncut = evaluate(PROBLEMS, resolve_policy("deepconf", {**online, "fixed": 0.0}, schedule="stream"), [12], 5,
                     resamples=20)
    # a warmup of sure and dropping traces puts the threshold between 5 and 12: later drops are cut
    assert stream.costs[0]["cut"] > 0 and stream.costs[0]["tokens"] < uncut.costs[0]["tokens"]
    assert stream.rows[0].accuracy >= uncut.rows[0].accuracy


def test_deepconf_needs_traces_over_its_own_top_k() -> None:
    bare = [dataclasses.replace(p, traces=None) for p in PROBLEMS]
    with pytest.raises(ReplayConfigError, match="records no 'traces'"):
        evaluate(bare, resolve_policy("deepconf", schedule="stream"), [4], 1)
    other_k = [problem("k", 3, 3, top_k=3)]
    with pytest.raises(ReplayConfigError, match="top-3"):
        evaluate(other_k, resolve_policy("deepconf", schedule="stream"), [4], 1)


def test_deepconf_replays_streamed_unless_told_otherwise() -> None:
    assert resolve_policy("deepconf").spec.schedule.mode == "stream"  # type: ignore[union-attr]
    assert resolve_policy("deepconf", schedule="rounds").spec.schedule.mode == "rounds"  # type: ignore[union-attr]
    assert resolve_policy("adaptive").spec.schedule is None  # the samples are the same: rounds, fastest
