"""Allocators by name: the built-ins plus third-party ones from the ``ttc.allocators`` entry points.

Nothing happens at import time and nothing is cached at module level: every call builds its answer
(entry points are read when a name is not built in, or when the full list is asked for).

A third-party package registers ``name = "package.module:AllocatorClass"`` under
``[project.entry-points."ttc.allocators"]``; the class must subclass :class:`~allocators.base.Allocator`.
Built-in names win over entry points of the same name; entry points that fail to load or are not
allocators are skipped with a warning (one broken plugin does not take the service down).
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Iterable, Mapping
from importlib.metadata import entry_points
from typing import Any, Protocol

from .adaptive_consistency import AdaptiveConsistency
from .base import Allocator, AllocatorParams
from .calibrated import CalibratedMargin
from .deepconf import DeepConf
from .difficulty import Difficulty
from .elimination import Elimination
from .errors import UnknownAllocatorError
from .esc import Esc
from .fixed import Fixed
from .greedy import Greedy
from .margin import Margin
from .two_stage import TwoStage
from .uniform import Uniform

ENTRY_POINT_GROUP = "ttc.allocators"

__all__ = [
    "ENTRY_POINT_GROUP",
    "UnknownAllocatorError",
    "available",
    "builtin_allocators",
    "create",
    "params_schema",
    "resolve",
    "validate_params",
]


class EntryPointLike(Protocol):
    """What is used of an ``importlib.metadata.EntryPoint`` (tests pass stand-ins)."""

    @property
    def name(self) -> str: ...

    def load(self) -> Any: ...


def builtin_allocators() -> dict[str, type[Allocator]]:
    """The allocators shipped with the service, by registry name."""
    classes: tuple[type[Allocator], ...] = (
        Fixed, AdaptiveConsistency, Esc, Margin, CalibratedMargin, Elimination, Greedy, Uniform, TwoStage, Difficulty,
        DeepConf,
    )
    return {cls.name: cls for cls in classes}


def _plugins(found: Iterable[EntryPointLike] | None) -> dict[str, type[Allocator]]:
    eps = entry_points(group=ENTRY_POINT_GROUP) if found is None else found
    out: dict[str, type[Allocator]] = {}
    for ep in eps:
        try:
            obj = ep.load()
        except Exception as exc:  # a plugin's import error must not break the registry
            warnings.warn(f"allocator entry point {ep.name!r} failed to load: {exc!r}", stacklevel=3)
            continue
        if not (isinstance(obj, type) and issubclass(obj, Allocator)):
            warnings.warn(f"allocator entry point {ep.name!r} is not an Allocator subclass", stacklevel=3)
            continue
        out[ep.name] = obj
    return out


def available(entry_points: Iterable[EntryPointLike] | None = None) -> dict[str, type[Allocator]]:
    """Built-ins plus the ``ttc.allocators`` entry points (``entry_points`` overrides discovery)."""
    found = _plugins(entry_points)
    builtins = builtin_allocators()
    for name in found.keys() & builtins.keys():
        warnings.warn(f"allocator entry point {name!r} is shadowed by the built-in", stacklevel=2)
    return {**found, **builtins}


def resolve(name: str, entry_points: Iterable[EntryPointLike] | None = None) -> type[Allocator]:
    """The allocator class registered as ``name``; raises :class:`UnknownAllocatorError`."""
    builtins = builtin_allocators()
    if name in builtins:
        return builtins[name]
    everything = available(entry_points)
    if name not in everything:
        raise UnknownAllocatorError(name, everything)
    return everything[name]


def validate_params(
    name: str, params: Mapping[str, Any] | None = None, entry_points: Iterable[EntryPointLike] | None = None
) -> AllocatorParams:
    """``name``'s params validated (pydantic ``ValidationError`` names the offending field)."""
    return resolve(name, entry_points).Params.model_validate(dict(params or {}))


def create(
    name: str,
    params: Mapping[str, Any] | None,
    rng: random.Random,
    entry_points: Iterable[EntryPointLike] | None = None,
) -> Allocator:
    """A new allocator ``name`` with validated ``params`` and the injected ``rng``.

    Raises :class:`UnknownAllocatorError` for an unknown name; lets pydantic's ``ValidationError``
    propagate for bad params.
    """
    cls = resolve(name, entry_points)
    return cls(cls.Params.model_validate(dict(params or {})), rng)


def params_schema(name: str, entry_points: Iterable[EntryPointLike] | None = None) -> dict[str, Any]:
    """JSON schema of ``name``'s params."""
    return resolve(name, entry_points).Params.model_json_schema()
