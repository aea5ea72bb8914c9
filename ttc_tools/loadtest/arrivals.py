"""Open-loop arrival schedules.

A Poisson process of rate λ (requests per second) has independent exponential inter-arrival gaps
with mean 1/λ: ``t_k = Σ_{i≤k} g_i``, ``g_i ~ Exp(λ)``. The schedule is drawn up front from a
seeded ``random.Random`` so a run is reproducible, and it is bounded by both a horizon (seconds)
and a count.
"""

from __future__ import annotations

import random


def poisson_arrivals(rate: float, *, duration_s: float, max_count: int,
                     rng: random.Random) -> list[float]:
    """Arrival offsets in seconds from the start, all ``< duration_s``, at most ``max_count`` of them."""
    if rate <= 0:
        raise ValueError("rate must be positive")
    if duration_s <= 0 or max_count <= 0:
        return []
    out: list[float] = []
    t = rng.expovariate(rate)
    while t < duration_s and len(out) < max_count:
        out.append(t)
        t += rng.expovariate(rate)
    return out
