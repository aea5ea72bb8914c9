"""Every ``ttc`` command's ``--help`` at 80 columns: nothing cut, every default shown whole."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner


@pytest.fixture(scope="module")
def ttc() -> typer.Typer:
    from app.cli import _register_feature_commands, app

    if not any(getattr(g, "name", None) == "policy" for g in app.registered_groups):
        _register_feature_commands()
    return app


def _commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every (sub-)command of typer's click tree (typer vendors click: duck-typed)."""
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


def _flat(text: str) -> str:
    """The help on one line: wrapped lines joined (a line broken after a hyphen joined without a space)."""
    return " ".join(re.sub(r"-\n\s+", "-", text).split())


def test_every_help_is_whole_at_80_columns(ttc: typer.Typer) -> None:
    root = typer.main.get_command(ttc)
    paths = [p for p, _ in _commands(root)]
    assert {("serve",), ("replay",), ("loadtest",), ("policy", "list"), ("bench", "peers")} <= set(paths)
    for path, command in _commands(root):
        res = CliRunner().invoke(ttc, [*path, "--help"], env={"COLUMNS": "80"})
        assert res.exit_code == 0, (path, res.output)
        out = res.output
        assert "…" not in out, (path, out)
        ctx = command.context_class(command, info_name="ttc")
        flat = _flat(out)
        for param in command.params:
            record = param.get_help_record(ctx) if param.param_type_name == "option" else None
            if record is None:
                continue
            shown = re.search(r"\[(default: .*?)(?:; [^;\]]*)?\]$", record[1])
            if shown:  # the default click renders appears whole, however the line was wrapped
                assert f"[{shown.group(1)}" in flat, (path, param.name, shown.group(1), out)
        if hasattr(command, "commands"):  # sub-command summaries are not cut either
            listing = out.split("Commands:", 1)[1]
            assert "..." not in listing, (path, listing)


def test_loadtest_help_shows_the_concurrency_default(ttc: typer.Typer) -> None:
    out = _flat(CliRunner().invoke(ttc, ["loadtest", "--help"], env={"COLUMNS": "80"}).output)
    assert ("--concurrency <str> Closed-loop levels: comma list of clients. [default: (1,8 unless --rate is "
            "given)]") in out
    assert "[default: (the bundled data/demo-arith-n64.jsonl)]" in out  # not this checkout's absolute path
