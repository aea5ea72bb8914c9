"""Pure allocation logic: how many samples each query gets, round by round.

No web, HTTP client or database imports here; the service, the replay evaluator and the tests share
this library. Public surface:

* the contract: :class:`Allocator`, :class:`AllocatorParams`, :class:`QueryState`, :class:`Sample`,
  :class:`Budget`, ``Plan``;
* the registry: :func:`available`, :func:`create`, :func:`resolve`, :func:`params_schema`,
  :func:`builtin_allocators` (third-party allocators register under the ``ttc.allocators`` entry points);
* the policies (one module each; :class:`PerQueryAllocator` is the base of those that decide each
  query alone) and their building blocks (Beta rule, exploration rules, budget
  arithmetic), the offline :func:`simulate` and :func:`bench_plan` (timing of ``plan``).

The service imports this package's top level only; ``tests/unit/test_alloc_registry.py`` pins
``__all__``.
"""

from .adaptive_consistency import AdaptiveConsistency, AdaptiveConsistencyParams
from .base import Allocator, AllocatorParams, Budget, Plan, QueryState, Sample
from .bench import bench_plan
from .budgeting import BudgetParams, check_plan, proportional_split, sample_limit, water_fill
from .calibrated import CalibratedMargin, CalibratedMarginParams
from .deepconf import DeepConf, DeepConfParams
from .difficulty import Difficulty, DifficultyParams, OnlineLogistic, majority_accuracy, majority_gain
from .elimination import Elimination, EliminationParams
from .errors import AllocatorError, PlanError, UnknownAllocatorError
from .esc import Esc, EscParams
from .exploration import EXPLORATION_RULES, ExplorationRule
from .fixed import Fixed, FixedParams
from .greedy import Greedy, GreedyParams
from .margin import Margin, MarginParams, weighted_lead
from .registry import (
    ENTRY_POINT_GROUP,
    available,
    builtin_allocators,
    create,
    params_schema,
    resolve,
    validate_params,
)
from .simulate import Trace
from .simulate import run as simulate
from .single import PerQueryAllocator, StoppingParams
from .stats import BetaRule, StatsCache, VoteStats, beta_confidence
from .two_stage import TwoStage, TwoStageParams
from .uniform import Uniform, UniformParams

__all__ = [
    "ENTRY_POINT_GROUP",
    "EXPLORATION_RULES",
    "AdaptiveConsistency",
    "AdaptiveConsistencyParams",
    "Allocator",
    "AllocatorError",
    "AllocatorParams",
    "BetaRule",
    "Budget",
    "BudgetParams",
    "CalibratedMargin",
    "CalibratedMarginParams",
    "DeepConf",
    "DeepConfParams",
    "Difficulty",
    "DifficultyParams",
    "Elimination",
    "EliminationParams",
    "Esc",
    "EscParams",
    "ExplorationRule",
    "Fixed",
    "FixedParams",
    "Greedy",
    "GreedyParams",
    "Margin",
    "MarginParams",
    "OnlineLogistic",
    "PerQueryAllocator",
    "Plan",
    "PlanError",
    "QueryState",
    "Sample",
    "StatsCache",
    "StoppingParams",
    "Trace",
    "TwoStage",
    "TwoStageParams",
    "Uniform",
    "UniformParams",
    "UnknownAllocatorError",
    "VoteStats",
    "available",
    "bench_plan",
    "beta_confidence",
    "builtin_allocators",
    "check_plan",
    "create",
    "majority_accuracy",
    "majority_gain",
    "params_schema",
    "proportional_split",
    "resolve",
    "sample_limit",
    "simulate",
    "validate_params",
    "water_fill",
    "weighted_lead",
]
