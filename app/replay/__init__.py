"""Offline replay: evaluate a policy on recorded samples through the engine loop (``ttc replay``).

Public surface: :func:`evaluate`, :func:`resolve_policy`, :class:`Report`, :class:`Row`,
:class:`ReplayConfigError` (from :mod:`app.replay.evaluator`) and the numpy reference curves in
:mod:`app.replay.baselines`. Imported lazily so the ``ttc`` CLI starts without numpy or the engine.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.replay.evaluator import ReplayConfigError, Report, Row, evaluate, resolve_policy

__all__ = ["ReplayConfigError", "Report", "Row", "evaluate", "resolve_policy"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("app.replay.evaluator"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
