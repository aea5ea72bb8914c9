"""Problem files, response parsing, loopback checks and correctness scoring of the load tester."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ttc_tools.loadtest.data import load_problems
from ttc_tools.loadtest.records import RequestRecord, apply_json, apply_sse, error_type
from ttc_tools.loadtest.scoring import score_one, score_records
from ttc_tools.loadtest.target import NotLoopback, require_loopback


def _write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_load_all_file_shapes(tmp_path: Path) -> None:
    math = _write(tmp_path / "m.jsonl", [{"problem": "P?", "answer": "\\frac{1}{2}", "unique_id": "u1"}])
    gsm = _write(tmp_path / "g.jsonl", [{"question": "Q?", "answer": "so #### 1,234"}])
    rep = _write(tmp_path / "r.jsonl", [{"id": "a", "question": "R?", "gold": None, "answers": []}])
    assert [(p.id, p.question, p.gold) for p in load_problems(math, shuffle=False)] == [("u1", "P?", "\\frac{1}{2}")]
    assert load_problems(gsm, shuffle=False)[0].gold == "1,234"
    assert load_problems(rep, shuffle=False)[0].gold is None


def test_load_limit_shuffle_and_errors(tmp_path: Path) -> None:
    f = _write(tmp_path / "x.jsonl", [{"question": f"q{i}", "answer": str(i)} for i in range(20)])
    a = load_problems(f, limit=5, shuffle=True, seed=1)
    assert len(a) == 5 and a == load_problems(f, limit=5, shuffle=True, seed=1)
    assert [p.gold for p in load_problems(f, limit=3, shuffle=False)] == ["0", "1", "2"]
    bad = _write(tmp_path / "bad.jsonl", [{"answer": "1"}])
    with pytest.raises(ValueError, match="line 1"):
        load_problems(bad)
    with pytest.raises(FileNotFoundError):
        load_problems(tmp_path / "missing.jsonl")


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "http://localhost:1/", "http://[::1]:80",
                                 "http://127.8.9.10:5"])
def test_loopback_targets_are_accepted(url: str) -> None:
    assert require_loopback(url) == url.rstrip("/")


@pytest.mark.parametrize("url", ["http://10.0.0.1:8000", "http://192.168.1.1", "http://example.com",
                                 "http://0.0.0.0:80", "ftp://127.0.0.1", "http://localhost.evil.com"])
def test_other_targets_are_refused(url: str) -> None:
    with pytest.raises(NotLoopback):
        require_loopback(url)


def test_parse_json_sse_and_errors() -> None:
    rec = RequestRecord("p", "closed", 1, 0, "a", "42", 0.0)
    apply_json(rec, {"choices": [{"message": {"content": "The answer is 42."}}],
                     "usage": {"completion_tokens": 72, "total_tokens": 80},
                     "ttc": {"samples_drawn": 8, "rounds": 2, "stop_reason": "cap", "answer": "42"}})
    assert (rec.samples, rec.rounds, rec.stop_reason, rec.completion_tokens, rec.answer) == (8, 2, "cap", 72, "42")
    rec2 = RequestRecord("p", "closed", 1, 0, "a", "42", 0.0)
    apply_sse(rec2, [{"choices": [{"delta": {"content": "The answer "}}]},
                     {"choices": [{"delta": {}}], "ttc": {"round": 1, "samples_drawn": 3, "votes": {}}},
                     {"choices": [{"delta": {"content": "is 41."}}]},
                     {"choices": [], "ttc": {"samples_drawn": 4, "rounds": 1, "stop_reason": "policy",
                                             "answer": None}},
                     {"choices": [], "usage": {"completion_tokens": 36, "total_tokens": 40}}])
    assert rec2.content == "The answer is 41." and rec2.samples == 4 and rec2.completion_tokens == 36
    assert error_type(504, b'{"error": {"type": "timeout_error", "code": "deadline_exceeded"}}') == \
        "http_504:deadline_exceeded"
    assert error_type(502, b"not json") == "http_502"


def test_scoring_prefers_the_voted_answer_and_falls_back_to_the_text() -> None:
    voted = RequestRecord("p", "closed", 1, 0, "a", "0.5", 0.0, answer="\\frac{1}{2}", content="junk 7")
    text = RequestRecord("p", "closed", 1, 0, "a", "1234", 0.0, content="So the answer is 1,234.")
    wrong = RequestRecord("p", "closed", 1, 0, "a", "3", 0.0, content="The answer is 4.")
    failed = RequestRecord("p", "closed", 1, 0, "a", "3", 0.0, answer="3", error="timeout")
    nogold = RequestRecord("p", "closed", 1, 0, "a", None, 0.0, answer="3")
    assert score_one(voted) and score_one(text)
    assert not score_one(wrong) and not score_one(failed)
    assert score_records([voted, text, wrong, failed, nogold]) == 0
    assert [r.correct for r in (voted, text, wrong, failed, nogold)] == [True, True, False, False, None]
