"""``ttc replay --policy a,b``: one table per policy, one JSON holding all, and a progress bar over
every (policy, budget, seed) run that stays off stderr unless it is a terminal."""

from __future__ import annotations

import io
import json
from pathlib import Path

import typer
from rich.console import Console
from typer.testing import CliRunner

from app.replay import cli as replay_cli
from tests.unit.test_replay_cli import write_replay


def test_a_comma_list_of_policies_gives_a_table_and_a_report_each(cli: typer.Typer, tmp_path: Path) -> None:
    data = write_replay(tmp_path / "r.jsonl")
    out, png = tmp_path / "out.json", tmp_path / "out.png"
    result = CliRunner().invoke(cli, ["replay", "--data", str(data), "--policy", "elimination, greedy,elimination",
                                      "--budgets", "1,2", "--seeds", "2", "--resamples", "20", "--json", str(out),
                                      "--plot", str(png)])
    assert result.exit_code == 0, result.output
    assert "replay elimination on r.jsonl" in result.output and "replay greedy on r.jsonl" in result.output
    assert result.output.index("replay elimination") < result.output.index("replay greedy")
    doc = json.loads(out.read_text())
    assert doc["policies"] == ["elimination", "greedy"]  # each once, in the order given
    assert [r["policy"] for r in doc["reports"]] == ["elimination", "greedy"]
    for report in doc["reports"]:
        assert [row["budget"] for row in report["rows"]] == [1.0, 2.0] and report["seeds"] == 2
    for name in ("elimination", "greedy"):
        assert (tmp_path / f"out-{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not png.exists()
    assert result.stderr == ""  # not a terminal: no progress bar


def test_one_policy_keeps_the_old_json_document(cli: typer.Typer, tmp_path: Path) -> None:
    data = write_replay(tmp_path / "r.jsonl")
    out = tmp_path / "one.json"
    result = CliRunner().invoke(cli, ["replay", "--data", str(data), "--policy", "greedy", "--budgets", "2",
                                      "--seeds", "1", "--resamples", "20", "--json", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["policy"] == "greedy" and "reports" not in doc and doc["rows"][0]["budget"] == 2.0


def test_the_progress_bar_counts_every_policy_budget_and_seed(tmp_path: Path) -> None:
    data = write_replay(tmp_path / "r.jsonl")
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=100)
    reports = replay_cli._run(data, "elimination,greedy", None, None, None, "1,2,4", 2, None, 20, progress=console)
    assert [r.policy.name for r in reports] == ["elimination", "greedy"]
    assert "12/12" in screen.getvalue()  # 2 policies x 3 budgets x 2 seeds
    assert replay_cli.progress_console(False) is None


def test_unknown_policy_in_the_list_fails_before_any_run(cli: typer.Typer, tmp_path: Path) -> None:
    data = write_replay(tmp_path / "r.jsonl")
    result = CliRunner().invoke(cli, ["replay", "--data", str(data), "--policy", "greedy,nope", "--seeds", "1"])
    assert result.exit_code == 2 and "unknown policy" in result.output
    assert "replay greedy" not in result.output
    result = CliRunner().invoke(cli, ["replay", "--data", str(data), "--policy", " , "])
    assert result.exit_code != 0 and "one or more policy names" in result.output
