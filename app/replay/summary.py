"""Summaries of replay outcomes: rows with bootstrap intervals, and the compute-efficiency ratio.

A row averages a budget's ``(seeds, problems)`` outcomes over problems and seeds; its 95% interval
is a percentile bootstrap over problems of the per-problem means across seeds (:class:`Bootstrap`).
The *compute-efficiency ratio* of a row is the mean samples uniform needs to reach the row's
accuracy (linear interpolation on uniform's curve at budgets ``0..N``) divided by the row's mean
samples; ``None`` where uniform never reaches it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.replay.baselines import Outcomes


@dataclass(frozen=True, slots=True)
class Row:
    """One budget's summary; ``*_ci`` are 95% bootstrap intervals."""

    budget: float
    mean_samples: float
    mean_samples_ci: tuple[float, float]
    accuracy: float
    accuracy_ci: tuple[float, float]
    coverage: float
    coverage_ci: tuple[float, float]
    tokens: float | None = None
    """Mean completion tokens per problem; None where the data records no ``tokens``."""

    def to_json(self) -> dict[str, Any]:
        return {"budget": self.budget, "mean_samples": self.mean_samples,
                "mean_samples_ci": list(self.mean_samples_ci), "accuracy": self.accuracy,
                "accuracy_ci": list(self.accuracy_ci), "coverage": self.coverage,
                "coverage_ci": list(self.coverage_ci), "tokens": self.tokens}


class Bootstrap:
    """Percentile bootstrap over problems: ``resamples`` draws of ``P`` problem indices (seeded),
    applied to the per-problem means across seeds of a ``(seeds, problems)`` matrix."""

    def __init__(self, n_problems: int, resamples: int = 1000, seed: int = 0) -> None:
        self.idx = np.random.default_rng(seed).integers(0, n_problems, size=(resamples, n_problems))

    def ci(self, values: np.ndarray) -> tuple[float, float]:
        per_problem = np.asarray(values, dtype=np.float64).mean(axis=0)
        means = per_problem[self.idx].mean(axis=1)
        lo, hi = np.percentile(means, [2.5, 97.5])
        return float(lo), float(hi)

    def row(self, budget: float, out: Outcomes, tokens: bool = True) -> Row:
        """The summary of ``out``; its tokens only where ``tokens`` (the data records them)."""
        return Row(budget, float(np.mean(out.samples)), self.ci(out.samples),
                   float(np.mean(out.correct)), self.ci(out.correct),
                   float(np.mean(out.covered)), self.ci(out.covered),
                   float(np.mean(out.tokens)) if tokens and out.tokens is not None else None)


def uniform_needed(accuracy: float, xs: np.ndarray, ys: np.ndarray) -> float | None:
    """Mean samples at which uniform's curve ``(xs, ys)`` first reaches ``accuracy`` (linear
    interpolation between its points), ``None`` if it never does."""
    hits = np.flatnonzero(ys >= accuracy - 1e-12)
    if hits.size == 0:
        return None
    i = int(hits[0])
    if i == 0:
        return float(xs[0])
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return float(x0 + (accuracy - y0) / (y1 - y0) * (x1 - x0))


def efficiency(rows: Sequence[Row], xs: np.ndarray, ys: np.ndarray) -> list[float | None]:
    """Compute-efficiency ratio per row: uniform's mean samples for the same accuracy / the row's."""
    out: list[float | None] = []
    for r in rows:
        need = uniform_needed(r.accuracy, xs, ys)
        out.append(None if need is None or r.mean_samples <= 0 else need / r.mean_samples)
    return out
