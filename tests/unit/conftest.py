"""Fixtures shared by the unit tests."""

from __future__ import annotations

import pytest
import typer

from app.replay.cli import register


@pytest.fixture(scope="module")
def cli() -> typer.Typer:
    """``ttc replay`` and ``ttc bench replay`` on a bare typer app (for CliRunner)."""
    app = typer.Typer()
    bench = typer.Typer()
    app.add_typer(bench, name="bench")
    register(app, bench)
    return app
