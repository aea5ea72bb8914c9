"""DeepConf's measure and rule: token and group confidence, the warmup percentile, consensus."""

from __future__ import annotations

import random

import pytest

from allocators import DeepConf, DeepConfParams, QueryState, Sample
from allocators.deepconf import percentile
from app.confidence import token_top_logprobs, trace_confidence


def test_a_finished_samples_confidence_is_its_lowest_window_mean_of_negative_mean_top_k_logprobs() -> None:
    chat = {"content": [{"top_logprobs": [{"logprob": -0.1}, {"logprob": -3.0}]},  # C = 1.55
                        {"top_logprobs": [{"logprob": -0.1}, {"logprob": -1.0}]},  # C = 0.55: group 1.05
                        {"top_logprobs": [{"logprob": -0.5}, {"logprob": -0.5}, {"logprob": -9.0}]}]}  # top 2: 0.5
    assert trace_confidence(chat, "chat", 2, 2) == pytest.approx(0.525)
    short = {"content": [{"top_logprobs": [{"logprob": -2.0}]}]}
    assert trace_confidence(short, "chat", 10, 1) == pytest.approx(2.0)  # shorter than the window: all of it


def test_top_logprobs_are_read_from_chat_and_completion_objects() -> None:
    chat = {"content": [{"token": "a", "logprob": -0.1, "top_logprobs": [{"logprob": -0.1}, {"logprob": -2.0}]},
                        {"token": "b", "logprob": -0.3}]}
    assert token_top_logprobs(chat, "chat") == [[-0.1, -2.0], []]
    completion = {"tokens": ["a"], "token_logprobs": [-0.1], "top_logprobs": [{"a": -0.1, "b": -4.0}]}
    assert token_top_logprobs(completion, "completion") == [[-0.1, -4.0]]
    assert trace_confidence(completion, "completion", 4, 2) == pytest.approx(2.05)
    assert trace_confidence(None, "chat", 4, 2) is None


def test_percentile_interpolates() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile([4.0, 1.0], 0) == 1.0 and percentile([4.0, 1.0], 100) == 4.0


def state(*samples: tuple[str | None, float]) -> QueryState:
    return QueryState(id="q", cap=32, samples=[Sample(answer=a, confidence=c, truncated=a is None) for a, c in samples])


def test_warmup_then_threshold_then_consensus() -> None:
    alloc = DeepConf(DeepConfParams(warmup=4, keep=90, consensus=0.95, step=2), random.Random(0))
    assert alloc.want(state()) == 4 and alloc.cut_below(state(("1", 5.0))) is None
    warm = state(("1", 5.0), ("1", 5.0), ("2", 1.0), ("1", 5.0))
    assert alloc.cut_below(warm) == pytest.approx(percentile([5.0, 5.0, 1.0, 5.0], 10))
    assert alloc.want(warm) == 2  # the leader holds 15 of 16 of the confidence weight: 0.9375 < 0.95
    assert DeepConf(DeepConfParams(warmup=4, consensus=0.9), random.Random(0)).want(warm) == 0
    sure = state(("1", 5.0), ("1", 5.0), ("1", 5.0), ("1", 5.0))
    assert alloc.want(sure) == 0 and alloc.finished(sure)
    fixed = DeepConf(DeepConfParams(fixed=2.0), random.Random(0))
    assert fixed.cut_below(state()) == 2.0
