"""``ttc replay`` / ``ttc bench replay`` end to end on small synthetic replay files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

ROW_KEYS = {"budget", "mean_samples", "accuracy", "accuracy_ci", "coverage", "coverage_ci"}




def write_replay(path: Path, scores: bool = False) -> Path:
    rows = []
    for i, answers in enumerate([["1"] * 6, ["1", "2", "2", "1", "3", "1"], ["2"] * 5 + [None], ["3", "1"] * 3]):
        rec: dict[str, object] = {"id": f"p{i}", "question": f"Question {i}?", "gold": "1", "answers": answers,
                                  "correct": [a == "1" for a in answers], "meta": {"dataset": "synthetic"}}
        if scores:
            rec["scores"] = [0.9 if a == "1" else 0.1 for a in answers]
        rows.append(json.dumps(rec))
    path.write_text("\n".join(rows) + "\n")
    return path


def test_replay_writes_json_and_plot(cli: typer.Typer, tmp_path: Path) -> None:
    data = write_replay(tmp_path / "r.jsonl")
    out, png = tmp_path / "out.json", tmp_path / "out.png"
    result = CliRunner().invoke(cli, ["replay", "--data", str(data), "--policy", "elimination", "--budgets", "1,2.5,4",
                                      "--seeds", "3", "--resamples", "50", "--json", str(out), "--plot", str(png)])
    assert result.exit_code == 0, result.output
    assert "oracle" in result.output and "majority@6" in result.output and "efficiency" in result.output
    doc = json.loads(out.read_text())
    assert doc["policy"] == "elimination"
    for key in ("rows", "uniform", "oracle"):
        assert [r["budget"] for r in doc[key]] == [1.0, 2.5, 4.0]
        for r in doc[key]:
            assert set(r) >= ROW_KEYS
            lo, hi = r["accuracy_ci"]
            assert lo <= r["accuracy"] <= hi
    assert doc["rows"][1]["mean_samples"] <= 2.5
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_replay_with_ground_truth_and_scores(cli: typer.Typer, tmp_path: Path) -> None:
    data = write_replay(tmp_path / "s.jsonl", scores=True)
    for verifier in ("ground_truth", "scores"):
        out = tmp_path / f"{verifier}.json"
        result = CliRunner().invoke(cli, ["replay", "--data", str(data), "--verifier", verifier, "--budgets", "6",
                                          "--seeds", "2", "--resamples", "20", "--json", str(out)])
        assert result.exit_code == 0, result.output
        row = json.loads(out.read_text())["rows"][0]
        # The verifier picks the answer (weighted majority): right wherever a correct sample exists (not p2).
        assert row["accuracy"] == row["coverage"] == 0.75


@pytest.mark.parametrize(("content", "message"), [
    ('{"id": "a", "answers": ["1"]}\n', "missing field 'correct'"),
    ('{"id": "a", "answers": ["1", "2"], "correct": [true]}\n', "equal length"),
    ("not json\n", "not JSON"),
    ("", "no problems"),
])
def test_malformed_file_is_a_clear_error(cli: typer.Typer, tmp_path: Path, content: str, message: str) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(content)
    result = CliRunner().invoke(cli, ["replay", "--data", str(bad), "--seeds", "1"])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(("args", "message"), [
    (["--policy", "nope"], "unknown policy"),
    (["--params", "{not json"], "not JSON"),
    (["--verifier", "scores"], "needs a 'scores' list"),
    (["--verifier", "maybe"], "unknown verifier"),
    (["--budgets", "0,2"], "positive"),
])
def test_bad_arguments_fail_cleanly(cli: typer.Typer, tmp_path: Path, args: list[str], message: str) -> None:
    data = write_replay(tmp_path / "r.jsonl")
    result = CliRunner().invoke(cli, ["replay", "--data", str(data), "--seeds", "1", *args])
    assert result.exit_code != 0
    assert message in result.output


def test_missing_file_is_a_clear_error(cli: typer.Typer, tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["replay", "--data", str(tmp_path / "absent.jsonl")])
    assert result.exit_code == 2
    assert "cannot read" in result.output


def test_bench_replay_prints_wall_time_and_plan_time(cli: typer.Typer, tmp_path: Path) -> None:
    data = write_replay(tmp_path / "r.jsonl")
    result = CliRunner().invoke(cli, ["bench", "replay", "--data", str(data), "--seeds", "2", "--budgets", "1,2",
                                      "--queries", "200"])
    assert result.exit_code == 0, result.output
    assert "full replay: 4 problems x 2 budgets x 2 seeds" in result.output
    assert "plan, 200 active queries" in result.output


def write_timed_replay(path: Path) -> Path:
    """Six samples per problem with token counts (the simulated clock's durations)."""
    rows = []
    for i, answers in enumerate([["1"] * 6, ["1", "2", "2", "1", "3", "1"], ["2", "1", "1", "1", "2", "1"]]):
        rows.append(json.dumps({"id": f"p{i}", "question": f"Question {i}?", "gold": "1", "answers": answers,
                                "correct": [a == "1" for a in answers], "tokens": [10 + 7 * j for j in range(6)]}))
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.mark.parametrize("policy", ["fixed", "adaptive"])
def test_replay_reports_tokens_and_simulated_latency_per_schedule(cli: typer.Typer, tmp_path: Path,
                                                                  policy: str) -> None:
    data = write_timed_replay(tmp_path / "t.jsonl")
    docs = {}
    for schedule in ("rounds", "stream"):
        out = tmp_path / f"{schedule}.json"
        result = CliRunner().invoke(cli, ["replay", "--data", str(data), "--policy", policy, "--budgets", "6",
                                          "--seeds", "4", "--resamples", "20", "--schedule", schedule,
                                          "--json", str(out)])
        assert result.exit_code == 0, result.output
        assert "steps p50" in result.output and f"schedule {schedule}" in result.output
        docs[schedule] = json.loads(out.read_text())
        assert docs[schedule]["schedule"] == schedule
    rounds, stream = docs["rounds"]["costs"][0], docs["stream"]["costs"][0]
    assert rounds["tokens"] > 0 and rounds["steps_p50"] > 0
    if policy == "fixed":  # one call of all six either way: the same tokens, as long as its longest sample
        assert rounds == stream
    else:  # stream decides at every finished sample instead of after every round
        assert stream["steps_p90"] <= rounds["steps_p90"]


def test_replay_refuses_an_unknown_schedule(cli: typer.Typer, tmp_path: Path) -> None:
    data = write_timed_replay(tmp_path / "t.jsonl")
    result = CliRunner().invoke(cli, ["replay", "--data", str(data), "--schedule", "sometimes"])
    assert result.exit_code != 0 and "rounds or stream" in result.output
