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
    ('{"id": "a", "answers": ["1", "2"], "correct": [true, "false"]}\n', ":1: 'correct' must hold booleans"),
    ('{"id": "a", "answers": ["1"], "correct": [1]}\n', "'correct' must hold booleans"),
    ('{"id": "a", "answers": ["1"], "correct": [true]}\n{"id": "b", "answers": ["1"], "correct": [true], '
     '"tokens": ["12"]}\n', ":2: 'tokens' must hold non-negative integers"),
    ('{"id": "a", "answers": ["1"], "correct": [true], "tokens": [-3]}\n', "non-negative integers (item 0 is -3)"),
    ('{"id": "a", "answers": ["1"], "correct": [true], "scores": ["high"]}\n', "'scores' must hold finite numbers"),
    ('{"id": "a", "answers": ["1"], "correct": [true], "logprobs": [NaN]}\n', "'logprobs' must hold finite"),
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


def test_replay_takes_a_live_priority_and_says_it_in_the_caption(cli: typer.Typer, tmp_path: Path) -> None:
    data = write_timed_replay(tmp_path / "t.jsonl")
    out = tmp_path / "lean.json"
    result = CliRunner().invoke(cli, ["replay", "--data", str(data), "--policy", "adaptive", "--budgets", "6",
                                      "--seeds", "2", "--resamples", "20", "--schedule", "stream",
                                      "--priority", "tokens", "--json", str(out)], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "priority tokens: no speculation" in result.output
    assert json.loads(out.read_text())["spec"]["schedule"]["speculate"] is False
    wrong = CliRunner().invoke(cli, ["replay", "--data", str(data), "--priority", "cheap"])
    assert wrong.exit_code == 2 and "--priority" in wrong.output


def test_the_reference_rows_carry_tokens(cli: typer.Typer, tmp_path: Path) -> None:
    data = write_timed_replay(tmp_path / "t.jsonl")
    out = tmp_path / "out.json"
    result = CliRunner().invoke(cli, ["replay", "--data", str(data), "--policy", "adaptive", "--budgets", "2,6",
                                      "--seeds", "3", "--resamples", "20", "--json", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["has_tokens"] is True and "records no 'tokens'" not in result.output
    assert doc["uniform"][1]["tokens"] == pytest.approx(sum(10 + 7 * j for j in range(6)))  # every sample drawn
    assert 2 * 10 <= doc["uniform"][0]["tokens"] <= 2 * 45  # two of 10, 17, ..., 45
    for row, cost in zip(doc["rows"], doc["costs"], strict=True):
        assert row["tokens"] == pytest.approx(cost["tokens"])
    for oracle in doc["oracle"]:  # it draws up to the first correct sample of the problems it solves
        assert 10 * oracle["mean_samples"] <= oracle["tokens"] <= 45 * oracle["mean_samples"]


def test_a_file_without_tokens_says_so_instead_of_zero(cli: typer.Typer, tmp_path: Path) -> None:
    data = write_replay(tmp_path / "r.jsonl")
    out = tmp_path / "out.json"
    result = CliRunner().invoke(cli, ["replay", "--data", str(data), "--policy", "adaptive", "--budgets", "4",
                                      "--seeds", "2", "--resamples", "20", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "records no 'tokens'" in result.output
    doc = json.loads(out.read_text())
    assert doc["has_tokens"] is False and doc["costs"] is None
    assert all(r["tokens"] is None for key in ("rows", "uniform", "oracle") for r in doc[key])


def test_a_margin_policy_without_a_verifier_is_warned_about(cli: typer.Typer, tmp_path: Path) -> None:
    data = write_replay(tmp_path / "r.jsonl")
    args = ["replay", "--data", str(data), "--policy", "confident", "--verifier", "none", "--budgets", "4",
            "--seeds", "1", "--resamples", "20"]
    warned = CliRunner().invoke(cli, args)
    assert warned.exit_code == 0, warned.output
    assert "warning: confident: with --verifier none every vote weighs 1" in warned.output
    wider = CliRunner().invoke(cli, [*args, "--params", '{"margin": 2}'])
    assert wider.exit_code == 0 and "warning" not in wider.output
    scored = CliRunner().invoke(cli, [*args[:5], "--verifier", "ground_truth", *args[7:]])
    assert scored.exit_code == 0 and "warning" not in scored.output


def test_the_report_says_what_reaching_majority_accuracy_costs(cli: typer.Typer, tmp_path: Path) -> None:
    data = write_timed_replay(tmp_path / "t.jsonl")
    out = tmp_path / "out.json"
    result = CliRunner().invoke(cli, ["replay", "--data", str(data), "--policy", "fixed", "--budgets", "1,6",
                                      "--seeds", "3", "--resamples", "20", "--json", str(out)])
    assert result.exit_code == 0, result.output
    reach = json.loads(out.read_text())["reach"]
    assert reach["k"] == 6 and reach["majority_tokens"] == pytest.approx(165)  # 6 of 6 samples: 10 + 17 + ... + 45
    assert reach["budget"] in (1.0, 6.0) and reach["tokens"] <= 165 + 1e-9
    assert reach["ratio"] == pytest.approx(reach["tokens"] / 165)
    assert "tokens to reach majority@6 accuracy" in " ".join(result.output.split())


def test_tokens_to_reach_picks_the_cheapest_row_that_reaches_the_accuracy() -> None:
    from app.replay.evaluator import tokens_to_reach
    from app.replay.summary import Row

    def row(budget: float, accuracy: float, tokens: float | None) -> Row:
        return Row(budget, budget, (budget, budget), accuracy, (accuracy, accuracy), 1.0, (1.0, 1.0), tokens)

    ref = row(16, 0.80, 1000.0)
    got = tokens_to_reach([row(4, 0.70, 200.0), row(8, 0.796, 400.0), row(12, 0.82, 600.0)], ref, 16)
    assert got is not None and got["budget"] == 8 and got["tokens"] == 400.0 and got["ratio"] == 0.4
    missed = tokens_to_reach([row(4, 0.70, 200.0)], ref, 16)
    assert missed is not None and missed["budget"] is None and missed["tokens"] is None and missed["ratio"] is None
    assert tokens_to_reach([row(4, 0.9, None)], row(16, 0.8, None), 16) is None
