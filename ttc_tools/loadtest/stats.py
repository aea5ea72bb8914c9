"""Summaries of one load level: latency percentiles, throughput, cost and accuracy.

* Latency and time-to-first-byte go into HdrHistograms in microseconds (1 µs .. 10 min, 3
  significant digits, so a reported percentile is within 0.1 % of the exact order statistic).
  Only successful requests are recorded. ``pXX`` is HdrHistogram's value at that percentile.
* Throughput = successful requests / elapsed wall time of the level (first send to last answer).
* Accuracy = correct / scored, where scored = requests whose problem has a gold answer; a failed
  request counts as incorrect (the client got no answer). The 95 % interval is a percentile
  bootstrap: resample the 0/1 correctness vector with replacement ``B`` times (seeded), take the
  2.5th and 97.5th percentiles of the resampled means.
* Tokens per query = mean completion tokens (``usage.completion_tokens``, summed by the service over
  all samples) over successful requests; samples per query likewise from ``ttc.samples_drawn``.
* Nothing is computed over zero successes: a level where every request failed has no latency,
  time to first byte, per-query means or accuracy (``None`` in :meth:`LevelSummary.row`, so ``null``
  in JSON and ``-`` in the table; the dataclass keeps 0.0 there, check ``ok``), and a level whose data
  has no gold answer has no accuracy. A level with fewer than :data:`MIN_OK_FOR_INTERVAL` (30)
  successful scored requests gets a warning (:func:`level_warnings`): with so few 0/1 outcomes a
  percentile-bootstrap interval is both wide and unreliable (30 is the usual rule of thumb below which
  a proportion's interval should not be trusted), so its accuracy says little.
* ``errors`` counts failed requests by type (``http_<status>[:code]``, ``timeout``, ...) and
  ``error_examples`` keeps the first message seen for each type.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from hdrh.histogram import HdrHistogram

from ttc_tools.loadtest.records import RequestRecord

_MAX_US = 600_000_000
MIN_OK_FOR_INTERVAL = 30
"""Fewer successful scored requests than this in a level: its accuracy interval means little (warned)."""


def new_histogram() -> HdrHistogram:
    return HdrHistogram(1, _MAX_US, 3)


def record_seconds(hist: HdrHistogram, seconds: float) -> None:
    """Record one duration (clamped into the histogram's range)."""
    hist.record_value(min(_MAX_US, max(1, round(seconds * 1e6))))


def percentiles_ms(values_s: Sequence[float], qs: Sequence[float] = (50, 90, 99, 100)) -> dict[str, float]:
    """HdrHistogram percentiles in milliseconds, keyed ``p50``…, ``max`` for 100; zeros when empty."""
    hist = new_histogram()
    for v in values_s:
        record_seconds(hist, v)
    out = {}
    for q in qs:
        key = "max" if q >= 100 else f"p{q:g}"
        if hist.get_total_count() == 0:
            out[key] = 0.0
        elif q >= 100:
            out[key] = hist.get_max_value() / 1000.0
        else:
            out[key] = hist.get_value_at_percentile(q) / 1000.0
    return out


def bootstrap_ci(outcomes: Sequence[bool], *, resamples: int = 2000, level: float = 0.95,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap interval of the mean of 0/1 ``outcomes``; ``(0, 0)`` when empty."""
    if not outcomes:
        return (0.0, 0.0)
    x = np.asarray(outcomes, dtype=float)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(resamples, len(x)))].mean(axis=1)
    alpha = (1 - level) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha])
    return (float(lo), float(hi))


@dataclass
class LevelSummary:
    policy: str
    mode: str
    load: float
    elapsed_s: float
    requests: int
    ok: int
    failed: int
    throughput_rps: float
    offered_rps: float
    latency_p50_ms: float
    latency_p90_ms: float
    latency_p99_ms: float
    latency_max_ms: float
    ttfb_p50_ms: float
    ttfb_p99_ms: float
    samples_per_query: float
    tokens_per_query: float
    rounds_per_query: float
    scored: int
    accuracy: float
    accuracy_ci_low: float
    accuracy_ci_high: float
    errors: dict[str, int] = field(default_factory=dict)
    error_examples: dict[str, str] = field(default_factory=dict)
    """The first message seen for each error type of ``errors``."""
    stop_reasons: dict[str, int] = field(default_factory=dict)
    failed_after_kill: int | None = None
    backend_tokens_per_query: float | None = None
    """Generated tokens per request by the backends' own counter (``--backend-metrics``)."""

    scored_ok: int = 0
    """Successful requests with a gold answer: what the accuracy really rests on."""

    def row(self) -> dict[str, Any]:
        """The summary as a dict, with ``None`` for every measure that has nothing under it (module doc)."""
        out = asdict(self)
        if self.ok == 0:
            out.update(dict.fromkeys(OVER_SUCCESSES))
        if self.ok == 0 or self.scored == 0:
            out.update(dict.fromkeys(ACCURACY))
        return out


OVER_SUCCESSES = ("latency_p50_ms", "latency_p90_ms", "latency_p99_ms", "latency_max_ms", "ttfb_p50_ms",
                  "ttfb_p99_ms", "samples_per_query", "tokens_per_query", "rounds_per_query")
"""Fields of :class:`LevelSummary` measured over successful requests only."""
ACCURACY = ("accuracy", "accuracy_ci_low", "accuracy_ci_high")


def level_label(s: LevelSummary) -> str:
    unit = "clients" if s.mode == "closed" else "req/s"
    return f"{s.policy} · {s.mode} {s.load:g} {unit}"


def level_warnings(s: LevelSummary) -> list[str]:
    """What makes a level's figures meaningless or weak, in plain words (empty when nothing does)."""
    if s.requests == 0:
        return [f"{level_label(s)}: no request was sent"]
    if s.ok == 0:
        return [f"{level_label(s)}: no successful request ({s.failed} of {s.requests} failed): no latency or "
                "accuracy to report"]
    if 0 < s.scored_ok < MIN_OK_FOR_INTERVAL:
        return [f"{level_label(s)}: only {s.scored_ok} successful scored request(s) (fewer than "
                f"{MIN_OK_FOR_INTERVAL}): its accuracy interval means little; run it longer (--duration / "
                "--requests)"]
    return []


def _mean(xs: Sequence[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else 0.0


def summarize(records: Sequence[RequestRecord], *, policy: str, mode: str, load: float,
              elapsed_s: float, kill_at_s: float | None = None, seed: int = 0) -> LevelSummary:
    """Reduce one level's records (see the module docstring for every formula)."""
    ok = [r for r in records if r.error is None]
    lat = percentiles_ms([r.latency_s for r in ok])
    ttfb = percentiles_ms([r.ttfb_s for r in ok if r.ttfb_s is not None], (50, 99))
    outcomes = [bool(r.correct) for r in records if r.gold is not None]
    lo, hi = bootstrap_ci(outcomes, seed=seed)
    elapsed = max(elapsed_s, 1e-9)
    examples: dict[str, str] = {}
    for r in records:
        if r.error is not None and r.error not in examples:
            examples[r.error] = r.error_message or "(no message)"
    failed_after = None
    if kill_at_s is not None:
        failed_after = sum(1 for r in records if r.error is not None and r.end_s >= kill_at_s)
    return LevelSummary(
        policy=policy, mode=mode, load=load, elapsed_s=elapsed_s, requests=len(records), ok=len(ok),
        failed=len(records) - len(ok), throughput_rps=len(ok) / elapsed,
        offered_rps=(load if mode == "open" else len(records) / elapsed),
        latency_p50_ms=lat["p50"], latency_p90_ms=lat["p90"], latency_p99_ms=lat["p99"],
        latency_max_ms=lat["max"], ttfb_p50_ms=ttfb["p50"], ttfb_p99_ms=ttfb["p99"],
        samples_per_query=_mean([float(r.samples or 0) for r in ok]),
        tokens_per_query=_mean([float(r.completion_tokens or 0) for r in ok]),
        rounds_per_query=_mean([float(r.rounds or 0) for r in ok]),
        scored=len(outcomes), accuracy=_mean([float(o) for o in outcomes]),
        accuracy_ci_low=lo, accuracy_ci_high=hi,
        errors=dict(Counter(r.error for r in records if r.error is not None)),
        error_examples=examples,
        stop_reasons=dict(Counter(r.stop_reason for r in ok if r.stop_reason)),
        failed_after_kill=failed_after, scored_ok=sum(1 for r in ok if r.gold is not None),
    )
