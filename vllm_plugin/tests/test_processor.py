"""The monitor as vLLM runs it: the processor class with vLLM's own request and batch types, in the
engine's venv (``make test`` runs this file with ``.venv-vllm/bin/python``). Both interfaces are
driven step by step the way their runners call them, with logits whose confidence is known."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from ttc_monitor.args import MonitorArgs
from ttc_monitor.processor import ConfidenceMonitor, token_confidences
from ttc_monitor.window import first_cut
from vllm import SamplingParams
from vllm.v1.sample.logits_processor.interface import BatchUpdate, MoveDirectionality
from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext

VOCAB = 100
MARKER = 3
CONFIG = SimpleNamespace(model_config=SimpleNamespace(get_vocab_size=lambda: VOCAB))


def monitored(threshold: float, window: int = 4, top_k: int = 5) -> SamplingParams:
    return SamplingParams(extra_args=MonitorArgs(threshold, MARKER, window, top_k).as_xargs(), stop_token_ids=[MARKER])


def logits_with_confidence(rng: random.Random, sure: bool) -> torch.Tensor:
    """One row of logits: a peaked distribution (high confidence) or a flat one (low)."""
    row = torch.tensor([rng.gauss(0, 0.3) for _ in range(VOCAB)])
    if sure:
        row[rng.randrange(10, VOCAB)] += 12.0
    return row


def reference_confidence(row: torch.Tensor, k: int) -> float:
    logprobs = sorted(torch.log_softmax(row.double(), -1).tolist(), reverse=True)
    return -sum(logprobs[:k]) / k


def test_token_confidence_is_the_mean_of_the_top_k_negative_logprobs() -> None:
    rng = random.Random(0)
    rows = torch.stack([logits_with_confidence(rng, sure=i % 2 == 0) for i in range(6)])
    ks = [1, 5, 20, 3, 7, 2]
    got = token_confidences(rows, ks)
    for row, k, c in zip(rows, ks, got, strict=True):
        assert c == pytest.approx(reference_confidence(row, k), abs=1e-4)


def steps(rng: random.Random, n: int, drop_at: int) -> list[torch.Tensor]:
    """``n`` steps of logits, sure until ``drop_at``, unsure from then on."""
    return [logits_with_confidence(rng, sure=t < drop_at) for t in range(n)]


def test_v1_cuts_each_trace_at_its_first_group_under_the_threshold() -> None:
    """Two monitored children and one plain request in one batch, as the V1 runner calls it: only the
    monitored rows are touched, each forced to the marker at exactly the step the window arithmetic says."""
    rng = random.Random(1)
    monitor = ConfidenceMonitor(CONFIG, torch.device("cpu"), False)
    outputs: list[list[int]] = [[], [], []]
    threshold = 7.0  # sure steps are ~8-10 (their alternatives ~12 nats below), unsure ones ~4.6
    monitor.update_state(BatchUpdate(batch_size=3, removed=[], moved=[], added=[
        (0, monitored(threshold), [1, 2], outputs[0]), (1, SamplingParams(), [1, 2], outputs[1]),
        (2, monitored(threshold, window=2, top_k=3), [1, 2], outputs[2])]))
    plans = [steps(rng, 12, 5), steps(rng, 12, 2), steps(rng, 12, 8)]
    expected = {0: first_cut([reference_confidence(s, 5) for s in plans[0]], 4, threshold),
                2: first_cut([reference_confidence(s, 3) for s in plans[2]], 2, threshold)}
    assert expected[0] is not None and expected[2] is not None
    cut_at: dict[int, int] = {}
    for t in range(12):
        batch = torch.stack([plan[t] for plan in plans])
        before = batch.clone()
        out = monitor.apply(batch)
        assert torch.equal(out[1], before[1])  # not monitored
        for row in (0, 2):
            forced = torch.isinf(out[row]).sum().item() == VOCAB - 1 and out[row, MARKER].item() == 0.0
            if forced and row not in cut_at:
                cut_at[row] = t
            if row not in cut_at:
                assert torch.equal(out[row], before[row])
        for o in outputs:
            o.append(7)
        monitor.update_state(None)
    assert cut_at == expected


def test_v1_follows_removed_and_moved_requests() -> None:
    monitor = ConfidenceMonitor(CONFIG, torch.device("cpu"), False)
    a, b = [], []
    monitor.update_state(BatchUpdate(batch_size=2, removed=[], moved=[],
                                     added=[(0, monitored(1.0), None, a), (1, monitored(2.0), None, b)]))
    monitor.update_state(BatchUpdate(batch_size=1, removed=[0], moved=[(1, 0, MoveDirectionality.UNIDIRECTIONAL)],
                                     added=[]))
    assert list(monitor.traces) == [0] and monitor.traces[0].args.threshold == 2.0
    monitor.update_state(BatchUpdate(batch_size=1, removed=[], moved=[], added=[(0, SamplingParams(), None, [])]))
    assert monitor.traces == {}


def v2_context(slots: list[int], lengths: list[int]) -> LogitsContext:
    mapping = torch.tensor(slots, dtype=torch.int32)
    return LogitsContext(expanded_idx_mapping=mapping, idx_mapping=mapping, idx_mapping_np=np.array(slots),
                         expanded_local_pos=torch.zeros(len(slots), dtype=torch.int32),
                         input_ids=torch.zeros(len(slots), dtype=torch.int64),
                         pos=torch.tensor(lengths, dtype=torch.int64) - 1,
                         seq_lens_upper_bound_np=np.array(lengths))


def test_v2_cuts_by_slot_whatever_the_row_order() -> None:
    """Model Runner V2: requests live in slots, rows are reordered every step; the cut follows the slot."""
    rng = random.Random(2)
    monitor = ConfidenceMonitor(CONFIG, SimpleNamespace())
    assert monitor.v2
    assert monitor.add_request(5, monitored(7.0)) is True
    assert monitor.add_request(9, SamplingParams()) is False
    plan = steps(rng, 10, 4)
    expected = first_cut([reference_confidence(s, 5) for s in plan], 4, 7.0)
    assert expected is not None
    cut_at = None
    for t in range(10):
        other = logits_with_confidence(rng, sure=False)
        order = [(5, plan[t]), (9, other)] if t % 2 else [(9, other), (5, plan[t])]
        batch = torch.stack([row for _, row in order])
        out = monitor.apply(batch, v2_context([slot for slot, _ in order], [10 + t, 30 + t]))
        row = [slot for slot, _ in order].index(5)
        if cut_at is None and out[row, MARKER].item() == 0.0 and torch.isinf(out[row]).sum().item() == VOCAB - 1:
            cut_at = t
        assert torch.equal(out[1 - row], other)
    assert cut_at == expected
    assert monitor.add_request(5, SamplingParams()) is False and 5 not in monitor.traces  # a recycled slot


def test_a_step_computed_twice_counts_once() -> None:
    """The same position seen again (a prefill chunk, a recomputed step) replaces its confidence."""
    monitor = ConfidenceMonitor(CONFIG, SimpleNamespace())
    monitor.add_request(0, monitored(1e9, window=3))
    rng = random.Random(3)
    row = torch.stack([logits_with_confidence(rng, sure=True)])
    for _ in range(3):
        out = monitor.apply(row.clone(), v2_context([0], [7]))
    assert not torch.isinf(out).any()  # one token, not three: no full window, no cut
    assert monitor.traces[0].group.tokens == 1


@pytest.mark.parametrize(("xargs", "stop", "message"), [
    ({"ttc_monitor_threshold": 1.0}, [MARKER], "ttc_monitor_marker is required"),
    ({"ttc_monitor_threshold": 1.0, "ttc_monitor_marker": MARKER}, [], "stop_token_ids"),
    ({"ttc_monitor_threshold": math.inf, "ttc_monitor_marker": MARKER}, [MARKER], "ttc_monitor_threshold"),
    ({"ttc_monitor_threshold": 1.0, "ttc_monitor_marker": MARKER, "ttc_monitor_window": 0}, [MARKER],
     "ttc_monitor_window"),
    ({"ttc_monitor_threshold": 1.0, "ttc_monitor_marker": MARKER, "ttc_monitor_top_k": 21}, [MARKER],
     "ttc_monitor_top_k"),
    ({"ttc_monitor_treshold": 1.0}, [MARKER], "unknown monitor argument ttc_monitor_treshold"),
])
def test_admission_refuses_bad_arguments_naming_them(xargs: dict[str, object], stop: list[int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ConfidenceMonitor.validate_params(SamplingParams(extra_args=xargs, stop_token_ids=stop))
    ConfidenceMonitor.validate_params(SamplingParams())  # not monitored: nothing to check
