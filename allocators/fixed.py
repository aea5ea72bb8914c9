"""``fixed``: uniform self-consistency, ``n`` samples per query."""

from __future__ import annotations

import random

from pydantic import Field

from .base import QueryState
from .budgeting import BudgetParams
from .single import PerQueryAllocator


class FixedParams(BudgetParams):
    """Draw ``n`` samples per query, ``per_round`` at a time (default: all at once)."""

    n: int = Field(8, ge=1, le=1024, description="Samples per query.")
    per_round: int | None = Field(
        None, ge=1, le=1024, description="Samples per query per round (default: n, one round)."
    )


class Fixed(PerQueryAllocator):
    """Uniform N: a query wants ``min(per_round, min(n, cap) - spent)`` until it holds ``min(n, cap)``."""

    name = "fixed"
    Params = FixedParams
    params: FixedParams

    def __init__(self, params: FixedParams, rng: random.Random) -> None:
        super().__init__(params, rng)

    def stop_reason(self, state: QueryState) -> str:
        """Drawing ``n`` is the rule itself (``policy``), not a cap."""
        return "policy"

    def want(self, state: QueryState) -> int:
        p = self.params
        left = min(p.n, state.cap) - state.spent
        return min(p.per_round or p.n, left)
