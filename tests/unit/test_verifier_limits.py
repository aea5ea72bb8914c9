"""Verifier params are bounded like a request's fields: static bounds always, the service's limits when a
client's policy is validated with them, and reward-model templates that name only their two fields."""

from __future__ import annotations

from typing import Any

import pytest

from app.config import LimitsConfig
from app.errors import InvalidRequest
from app.policy import parse_spec
from app.verifiers.llm_judge import MAX_RUBRIC_CHARS

LIMITS = LimitsConfig(max_tokens=1000, max_prompt_chars=5000)


def judge(**params: Any) -> dict[str, Any]:
    return {"allocator": "fixed", "params": {"n": 2}, "aggregator": "best_of_n",
            "verifier": {"name": "llm_judge", "params": params}}


def reward_model(template: str) -> dict[str, Any]:
    params = {"url": "http://rm:8000", "model": "rm", "template": template}
    return {"allocator": "fixed", "params": {"n": 2}, "aggregator": "best_of_n",
            "verifier": {"name": "reward_model", "params": params}}


def refused(spec: dict[str, Any], limits: LimitsConfig | None = None, where: str = "ttc.policy") -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        parse_spec(spec, where, limits)
    return info.value


@pytest.mark.parametrize(("params", "field"), [
    ({"max_tokens": 10**12}, "max_tokens"),  # reached the backend
    ({"rubric": "x" * (MAX_RUBRIC_CHARS + 1)}, "rubric"),  # sent with every judge call
    ({"temperature": 3.0}, "temperature"),
])
def test_judge_params_have_static_bounds(params: dict[str, Any], field: str) -> None:
    err = refused(judge(**params))
    assert err.param == f"ttc.policy.verifier.params.{field}" and err.status_code == 400


def test_judge_params_are_held_to_the_service_limits() -> None:
    parse_spec(judge(max_tokens=1000, rubric="r" * 5000), "ttc.policy", LIMITS)  # at the limits
    err = refused(judge(max_tokens=1001), LIMITS)
    assert err.param == "ttc.policy.verifier.params.max_tokens" and "limit of 1000" in err.message
    err = refused(judge(rubric="r" * 5001), LIMITS)
    assert err.param == "ttc.policy.verifier.params.rubric" and "limit of 5000" in err.message
    parse_spec(judge(max_tokens=1001, rubric="r" * 5001), "ttc.policy")  # without limits: static bounds only


@pytest.mark.parametrize(("template", "says"), [
    ("{0}", "unknown field {0}"),  # answered 500 with a traceback when scoring
    ("{}", "unknown field {}"),
    ("{response!r:>99999999}", "conversion or format spec"),  # built a 200 MB POST
    ("{prompt:>{response}}", "conversion or format spec"),
    ("{prompt.__class__}", "unknown field {prompt.__class__}"),
    ("{prompt[0]}", "unknown field {prompt[0]}"),
    ("{reward}", "unknown field {reward}"),
    ("{prompt", "not a valid template"),
    ("}", "not a valid template"),
    ("x" * 65_537, "at most 65536 characters"),
])
def test_reward_model_templates_are_checked_when_saved(template: str, says: str) -> None:
    err = refused(reward_model(template), where="spec")
    assert err.param == "spec.verifier.params.template" and says in err.message


def test_templates_with_only_their_fields_are_accepted_and_format_to_their_texts() -> None:
    from app.backends.base import Draw
    from app.verifiers import create_verifier

    prompt, response = "P" * 1000, "R" * 1000
    for template in ("{prompt}\n\n{response}", "Q: {prompt} {{literal}} A: {response:}", "{response}", "no fields"):
        spec = parse_spec(reward_model(template), "spec")
        assert spec.verifier is not None
        verifier = create_verifier("reward_model", spec.verifier.params)
        [text] = verifier._payload(prompt, [Draw(response)])["input"]  # type: ignore[attr-defined]
        assert len(text) <= len(template) + len(prompt) + len(response)
    err = refused(reward_model("r" * 5001), LIMITS, where="spec")
    assert err.param == "spec.verifier.params.template" and "limit of 5000" in err.message
