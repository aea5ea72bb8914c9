"""`ttc bench latency`'s suites: what each compares by default, and how its targets judge rows."""

from __future__ import annotations

import pytest

from app.config import REPO_ROOT
from app.policy import BUILTIN_POLICIES
from app.protocol import PolicySpec
from ttc_tools.bench.latency import SUITES, THINKER_TARGETS, Row, lineup, paired_tokens_ratio, ttc_for, verdicts
from ttc_tools.loadtest.data import load_problems
from ttc_tools.loadtest.records import RequestRecord


@pytest.mark.parametrize("name", sorted(SUITES))
def test_every_suite_names_policies_the_service_knows_and_bundled_problems(name: str) -> None:
    suite = SUITES[name]
    measured = lineup(suite, None, [(p, p) for p in suite.policies])
    assert measured[0][0] == suite.baseline and [n for n, _ in measured[1:]] == list(suite.policies)
    for label, value in measured:  # a built-in's name (NAME@PRIORITY: NAME), or an inline policy the service accepts
        sent = ttc_for(label, value)["policy"]
        assert sent in BUILTIN_POLICIES if isinstance(sent, str) else PolicySpec.model_validate(sent)
    problems = load_problems(REPO_ROOT / "data" / suite.data, shuffle=True, seed=0)
    assert len(problems) >= 50 and all(p.gold is not None for p in problems)
    assert {t.policy for t in suite.targets} - {"*"} <= set(suite.policies)


def test_the_thinker_suite_sends_its_baseline_as_an_inline_16_sample_vote() -> None:
    measured = dict(lineup(SUITES["thinker"], None, [("calibrated", "calibrated")]))
    assert measured["self-consistency-16"] == {"allocator": "fixed", "params": {"n": 16}, "aggregator": "majority"}
    assert measured["calibrated"] == "calibrated"


def test_a_name_at_a_priority_sends_the_name_with_that_priority_and_nothing_else_is_split() -> None:
    assert ttc_for("calibrated@tokens", "calibrated@tokens") == {"policy": "calibrated", "priority": "tokens"}
    assert ttc_for("calibrated@latency", "calibrated@latency", {"priority": "tokens"}) == {
        "policy": "calibrated", "priority": "latency"}  # the entry's own wins over --priority
    assert ttc_for("calibrated", "calibrated", {"priority": "tokens"}) == {"policy": "calibrated", "priority": "tokens"}
    spec = {"allocator": "fixed"}
    assert ttc_for("mine@tokens", spec) == {"policy": spec}  # a spec's label is only a label
    assert ttc_for("team@cheap", "team@cheap") == {"policy": "team@cheap"}  # not a priority: the name as given


def test_a_given_spec_replaces_the_suite_s_under_its_label_and_a_given_baseline_wins() -> None:
    own = {"allocator": "fixed", "params": {"n": 12}, "aggregator": "majority"}
    measured = lineup(SUITES["thinker"], None, [("calibrated", "calibrated"), ("self-consistency-16", own)])
    assert measured == [("self-consistency-16", own), ("calibrated", "calibrated")]
    measured = lineup(SUITES["thinker"], "single", [("calibrated", "calibrated")])
    assert measured == [("single", "single"), ("calibrated", "calibrated")]


def _row(policy: str, p50: float, accuracy: float) -> Row:
    return Row(policy, 4, 40, 0, 0.3, p50, p50 * 2, 5.0, 4000.0, 4000.0, accuracy, (accuracy - 0.1, accuracy + 0.1))


@pytest.mark.parametrize(("p50", "accuracy", "met"), [(7.5, 0.80, [True, True]), (12.0, 0.80, [False, True]),
                                                      (7.5, 0.75, [True, False])])
def test_thinker_targets_judge_calibrated_p50_and_accuracy_against_the_baseline(
        p50: float, accuracy: float, met: list[bool]) -> None:
    base, mine = _row("self-consistency-16", 11.0, 0.79), _row("calibrated", p50, accuracy)
    mine.against(base)
    checks = verdicts([base, mine, _row("deepconf", 50.0, 0.1)], "self-consistency-16", THINKER_TARGETS)
    assert [ok for ok, _ in checks] == met
    assert all(line.startswith("calibrated @4 clients") for _, line in checks)
    assert checks[1][1].endswith(f"accuracy_delta {accuracy - 0.79:+.3f} (target >= 0)")


def test_the_thinker_tokens_target_judges_calibrated_at_priority_tokens_on_the_same_problems() -> None:
    base = Row("self-consistency-16", 4, 80, 0, 0.3, 11.9, 23.1, 16.0, 9500.0, 9500.0, 0.84, (0.75, 0.91))
    lean = Row("calibrated@tokens", 4, 54, 0, 0.15, 7.3, 75.9, 5.1, 5000.0, 5000.0, 0.87, (0.78, 0.94))
    lean.against(base)
    for paired, met in ((0.43, True), (0.55, False)):
        lean.tokens_paired = paired
        [(ok, line)] = [c for c in verdicts([base, lean], "self-consistency-16", THINKER_TARGETS) if "tokens" in c[1]]
        assert ok is met and line.startswith("calibrated@tokens @4 clients: tokens_paired") and "<= 0.48x" in line


def _rec(policy: str, problem: str, tokens: int, error: str | None = None) -> RequestRecord:
    return RequestRecord(policy, "closed", 4, 0, problem, "1", 0.0, completion_tokens=tokens, error=error)


def test_the_paired_token_ratio_is_over_the_problems_both_sides_answered() -> None:
    """The baseline reached the hard problem h, the slow policy only the easy e (twice): unpaired, its
    mean (100) over the baseline's (550) says 0.18x; on the one problem both answered it spends 0.5x."""
    base = [_rec("b", "e", 200), _rec("b", "h", 900)]
    mine = [_rec("m", "e", 100), _rec("m", "e", 100), _rec("m", "x", 50, error="timeout")]
    assert paired_tokens_ratio(mine, base) == 0.5
    assert paired_tokens_ratio([_rec("m", "z", 10)], base) is None  # nothing in common
