"""``esc``: Early-Stopping Self-Consistency (Li et al., 2024)."""

from __future__ import annotations

import random

from pydantic import Field

from .base import QueryState
from .single import PerQueryAllocator, StoppingParams


class EscParams(StoppingParams):
    """Sample in windows of ``window``; stop after a unanimous window or at ``max_samples``."""

    window: int = Field(5, ge=1, le=128, description="Window size w (samples per window).")
    max_samples: int = Field(40, ge=1, le=1024, description="Sample cap L per query.")


class Esc(PerQueryAllocator):
    """ESC: windows ``[0, w), [w, 2w), ...``; stop when the latest complete window is unanimous.

    Unanimous: all ``w`` samples carry the same non-null answer (zero vote entropy in the window).
    A round completes the current window: ``min(w - spent mod w, L - spent)`` samples.
    """

    name = "esc"
    Params = EscParams
    params: EscParams

    def __init__(self, params: EscParams, rng: random.Random) -> None:
        super().__init__(params, rng)

    def want(self, state: QueryState) -> int:
        w, cap = self.params.window, self.params.max_samples
        n = state.spent
        if n >= cap:
            return 0
        if n >= w and n % w == 0:
            first = state.samples[n - w].answer
            if first is not None and all(s.answer == first for s in state.samples[n - w + 1 : n]):
                return 0
        return min(w - n % w, cap - n)
