"""Command-line apps for tests: one command group registered as ``ttc`` registers it (with its ``bench``
group), or the whole ``ttc`` app with its feature commands."""

from __future__ import annotations

from collections.abc import Callable

import typer


def app_of(register: Callable[[typer.Typer, typer.Typer], None]) -> typer.Typer:
    """A ``ttc``-like app holding what ``register(app, bench)`` adds, and the ``bench`` group."""
    app, bench = typer.Typer(), typer.Typer()
    app.add_typer(bench, name="bench")
    register(app, bench)
    return app


def ttc_app() -> typer.Typer:
    """The real ``ttc`` app (``app.cli``) with its feature commands registered once."""
    from app.cli import _register_feature_commands, app

    if not any(getattr(g, "name", None) == "policy" for g in app.registered_groups):
        _register_feature_commands()
    return app
