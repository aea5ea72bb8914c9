"""The registry: names, params validation, JSON schemas, entry points."""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

import allocators
from allocators import Allocator, AllocatorParams, Budget, Plan, QueryState, registry
from allocators.registry import (
    UnknownAllocatorError,
    available,
    builtin_allocators,
    create,
    params_schema,
    resolve,
    validate_params,
)

BUILTINS = {"fixed", "adaptive_consistency", "esc", "margin", "calibrated_margin", "elimination", "greedy", "uniform",
            "two_stage", "difficulty", "deepconf"}


class Custom(Allocator):
    name = "custom"

    def plan(self, states: Any, budget: Budget) -> Plan:
        return {}


@dataclass
class FakeEntryPoint:
    name: str
    obj: Any = None
    error: Exception | None = None

    def load(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.obj


def test_builtin_names() -> None:
    assert set(builtin_allocators()) == BUILTINS
    for name, cls in builtin_allocators().items():
        assert cls.name == name


def test_create_every_builtin_with_defaults_and_plan_once() -> None:
    for name in BUILTINS:
        alloc = create(name, None, random.Random(0))
        plan = alloc.plan([QueryState(id="q", cap=4)], Budget(samples=3))
        assert 0 < sum(plan.values()) <= 3


def test_unknown_name() -> None:
    with pytest.raises(UnknownAllocatorError) as info:
        create("nope", {}, random.Random(0), entry_points=[])
    assert info.value.name == "nope"
    assert "fixed" in info.value.available
    assert isinstance(info.value, LookupError)


@pytest.mark.parametrize(
    ("name", "params", "field"),
    [
        ("fixed", {"n": 0}, "n"),
        ("fixed", {"n": 5000}, "n"),
        ("fixed", {"bogus": 1}, "bogus"),
        ("adaptive_consistency", {"threshold": 1.5}, "threshold"),
        ("esc", {"window": "wide"}, "window"),
        ("elimination", {"exploration": "random"}, "exploration"),
        ("elimination", {"gamma": -0.1}, "gamma"),
        ("two_stage", {"explore_fraction": 1.0}, "explore_fraction"),
        ("difficulty", {"max_samples": 0}, "max_samples"),
    ],
)
def test_bad_params_raise_validation_errors_naming_the_field(name: str, params: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        create(name, params, random.Random(0))
    assert field in {str(loc) for err in info.value.errors() for loc in err["loc"]}


def test_params_are_frozen_and_forbid_extras() -> None:
    params = validate_params("fixed", {"n": 3})
    assert isinstance(params, AllocatorParams)
    with pytest.raises(ValidationError):
        params.n = 4  # type: ignore[attr-defined]


def test_params_schema() -> None:
    for name in BUILTINS:
        schema = params_schema(name)
        assert schema["type"] == "object"
        assert schema.get("additionalProperties") is False
        assert "tokens_per_sample" in schema["properties"]
    props = params_schema("elimination")["properties"]
    assert props["k"]["default"] == 1
    assert set(props["exploration"]["enum"]) == {"all", "ucb", "gap", "entropy"}


def test_entry_points_add_allocators_and_builtins_win() -> None:
    eps = [FakeEntryPoint("custom", Custom), FakeEntryPoint("fixed", Custom)]
    with pytest.warns(UserWarning, match="shadowed"):
        found = available(entry_points=eps)
    assert found["custom"] is Custom
    assert found["fixed"] is builtin_allocators()["fixed"]
    alloc = create("custom", {}, random.Random(0), entry_points=[eps[0]])
    assert isinstance(alloc, Custom)
    assert resolve("custom", entry_points=[eps[0]]) is Custom
    assert params_schema("custom", entry_points=[eps[0]])["properties"] == {}


def test_broken_entry_points_are_skipped_with_a_warning() -> None:
    eps = [FakeEntryPoint("boom", error=ImportError("missing dep")), FakeEntryPoint("odd", obj=object)]
    with pytest.warns(UserWarning) as record:
        found = available(entry_points=eps)
    assert "boom" not in found and "odd" not in found
    assert len(record) == 2


def test_real_entry_point_discovery_runs() -> None:
    assert set(available()) >= BUILTINS


def test_registry_has_no_module_level_mutable_state() -> None:
    first = available(entry_points=[])
    first["junk"] = Custom
    assert "junk" not in available(entry_points=[])
    builtin_allocators().clear()
    assert set(builtin_allocators()) == BUILTINS
    mutable = (dict, list, set)
    assert not [k for k, v in vars(registry).items() if isinstance(v, mutable) and not k.startswith("__")]


def test_library_imports_no_service_dependencies() -> None:
    for mod in list(sys.modules):
        if mod.startswith("allocators"):
            source = getattr(sys.modules[mod], "__file__", None) or ""
            if source.endswith(".py"):
                text = Path(source).read_text(encoding="utf-8")
                for banned in ("fastapi", "httpx", "sqlalchemy", "import app", "from app"):
                    assert banned not in text, (mod, banned)
    assert allocators.create is create


PUBLIC_SURFACE = [
    "AdaptiveConsistency", "AdaptiveConsistencyParams", "Allocator", "AllocatorError", "AllocatorParams", "BetaRule",
    "Budget", "BudgetParams", "CalibratedMargin", "CalibratedMarginParams", "DeepConf", "DeepConfParams", "Difficulty",
    "DifficultyParams", "ENTRY_POINT_GROUP",
    "EXPLORATION_RULES", "Elimination", "EliminationParams", "Esc", "EscParams", "ExplorationRule", "Fixed",
    "FixedParams", "Greedy", "GreedyParams", "Margin", "MarginParams", "OnlineLogistic", "PerQueryAllocator", "Plan",
    "PlanError", "QueryState", "Sample", "StatsCache", "StoppingParams", "Trace", "TwoStage", "TwoStageParams",
    "Uniform", "UniformParams", "UnknownAllocatorError", "VoteStats", "available", "bench_plan", "beta_confidence",
    "builtin_allocators", "check_plan", "create", "majority_accuracy", "majority_gain", "params_schema",
    "proportional_split", "resolve", "sample_limit", "simulate", "validate_params", "water_fill", "weighted_lead",
]


def test_the_public_surface_is_pinned() -> None:
    """``allocators.__all__`` changes only on purpose (third-party allocators build on it): a new or
    removed name must be added here too."""
    assert sorted(allocators.__all__) == PUBLIC_SURFACE
    assert all(hasattr(allocators, name) for name in allocators.__all__)
