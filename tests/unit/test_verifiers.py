"""Verifiers: registry, reference, reward model (mock transport) and LLM judge (fake generator)."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from app.answers import AnswerRuntime, ParsePool, QueryCanon, kind_factory
from app.backends.base import Draw, DrawResult, SamplingRequest, Usage
from app.verifiers import (
    UnknownVerifierError,
    VerifierError,
    VerifyContext,
    builtin_verifiers,
    create_verifier,
)
from app.verifiers.llm_judge import DEFAULT_RUBRIC, parse_judgement

REQUEST = SamplingRequest(kind="chat", model="gen-model", messages=[{"role": "user", "content": "What is 6*7?"}])
RM = {"url": "http://rm:8000/v1/", "model": "rm-model"}


def draws(*texts: str) -> list[Draw]:
    return [Draw(text=t) for t in texts]


# --- registry ---------------------------------------------------------------------------------


def test_registry() -> None:
    assert set(builtin_verifiers()) == {"reference", "reward_model", "llm_judge", "likelihood", "code_tests", "prm"}
    assert builtin_verifiers()["reference"].needs_reference
    assert not builtin_verifiers()["llm_judge"].needs_reference
    with pytest.raises(UnknownVerifierError, match="unknown verifier 'orm'") as exc:
        create_verifier("orm")
    assert isinstance(exc.value, KeyError)


def test_params_are_validated_and_frozen() -> None:
    with pytest.raises(ValidationError):
        create_verifier("reward_model", {**RM, "bogus": 1})
    with pytest.raises(ValidationError):
        create_verifier("reward_model", {**RM, "endpoint": "embed"})
    with pytest.raises(ValidationError):
        create_verifier("reward_model", {"model": "m"})
    with pytest.raises(ValidationError):
        create_verifier("llm_judge", {"max_tokens": 0})
    judge = create_verifier("llm_judge", None)
    assert judge.params.max_tokens == 64  # type: ignore[attr-defined]
    with pytest.raises(ValidationError):
        judge.params.max_tokens = 3  # type: ignore[attr-defined]


# --- reference --------------------------------------------------------------------------------


async def test_reference_uses_recorded_flags() -> None:
    verifier = create_verifier("reference")
    ctx = VerifyContext(request=REQUEST, reference=None)
    result = await verifier.score(ctx, [Draw("x", correct=True), Draw("y", correct=False)])
    assert result.scores == [1.0, 0.0]
    assert result.usage.total_tokens == 0


@pytest.fixture(scope="module")
def parse_pool() -> Iterator[ParsePool]:
    pool = ParsePool(workers=1)
    yield pool
    pool.close()


def canon(pool: ParsePool) -> QueryCanon:
    return QueryCanon(kind_factory(None)(""), AnswerRuntime(pool))


async def test_reference_compares_answers(parse_pool: ParsePool) -> None:
    verifier = create_verifier("reference")
    ctx = VerifyContext(request=REQUEST, reference="42", canon=canon(parse_pool))
    candidates = [
        Draw(r"so \boxed{42}"),
        Draw("The answer is 42.0."),
        Draw("I think 41"),
        Draw("no idea"),
        Draw("ignored text", answer="42"),
        Draw(r"\boxed{\frac{84}{2}}"),
        Draw(r"\boxed{\sqrt{1764}}"),
        Draw(r"\boxed{x}"),
    ]
    result = await verifier.score(ctx, candidates)
    assert result.scores == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0]


async def test_reference_symbolic_gold(parse_pool: ParsePool) -> None:
    ctx = VerifyContext(request=REQUEST, reference=r"\frac{\sqrt{2}}{2}", canon=canon(parse_pool))
    result = await create_verifier("reference").score(
        ctx, draws(r"\boxed{\frac{1}{\sqrt{2}}}", r"\boxed{\sqrt{2}}", "0.5")
    )
    assert result.scores == [1.0, 0.0, 0.0]


async def test_reference_without_reference_raises() -> None:
    with pytest.raises(VerifierError, match="reference"):
        await create_verifier("reference").score(VerifyContext(request=REQUEST), draws("1"))


# --- reward model -----------------------------------------------------------------------------


def mock_client(handler: Callable[[httpx.Request], httpx.Response], seen: list[httpx.Request]) -> httpx.AsyncClient:
    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handler(request)

    return httpx.AsyncClient(transport=httpx.MockTransport(record))


def json_response(body: dict[str, Any], status: int = 200) -> Callable[[httpx.Request], httpx.Response]:
    return lambda _req: httpx.Response(status, json=body)


async def test_reward_model_classify() -> None:
    seen: list[httpx.Request] = []
    body = {
        "data": [
            {"index": 1, "probs": [0.2, 0.8], "num_classes": 2},
            {"index": 0, "probs": [0.9, 0.1], "num_classes": 2},
        ],
        "usage": {"prompt_tokens": 37, "total_tokens": 37},
    }
    async with mock_client(json_response(body), seen) as http:
        verifier = create_verifier("reward_model", RM)
        result = await verifier.score(VerifyContext(request=REQUEST, http=http), draws("A", "B"))
    assert result.scores == [0.1, 0.8]  # sorted back by index, positive class = last prob
    assert result.usage == Usage(prompt_tokens=37)
    assert len(seen) == 1
    assert str(seen[0].url) == "http://rm:8000/classify"
    assert json.loads(seen[0].content) == {
        "model": "rm-model",
        "input": ["What is 6*7?\n\nA", "What is 6*7?\n\nB"],
    }


async def test_reward_model_score_endpoint() -> None:
    seen: list[httpx.Request] = []
    body = {"data": [{"index": 0, "score": 0.75}, {"index": 1, "score": 3.0}], "usage": {"prompt_tokens": 20}}
    async with mock_client(json_response(body), seen) as http:
        verifier = create_verifier("reward_model", {**RM, "url": "http://rm:8000", "endpoint": "score"})
        result = await verifier.score(VerifyContext(request=REQUEST, http=http), draws("A", "B"))
    assert result.scores[0] == 0.75
    assert result.scores[1] == pytest.approx(1 / (1 + math.exp(-3.0)))  # logit squashed
    assert result.usage.prompt_tokens == 20
    assert str(seen[0].url) == "http://rm:8000/score"
    assert json.loads(seen[0].content) == {"model": "rm-model", "text_1": "What is 6*7?", "text_2": ["A", "B"]}


async def test_reward_model_pooling() -> None:
    seen: list[httpx.Request] = []
    body = {
        "data": [
            {"index": 0, "data": -2.0},
            {"index": 1, "data": [0.1, 0.6]},
            {"index": 2, "data": [[0.9, 0.1], [0.3, 0.7]]},
        ],
        "usage": {"prompt_tokens": 11},
    }
    params = {**RM, "endpoint": "pooling", "template": "Q: {prompt} A: {response}"}
    async with mock_client(json_response(body), seen) as http:
        verifier = create_verifier("reward_model", params)
        result = await verifier.score(VerifyContext(request=REQUEST, http=http), draws("x", "y", "z"))
    assert result.scores == pytest.approx([1 / (1 + math.exp(2.0)), 0.6, 0.7])
    assert str(seen[0].url) == "http://rm:8000/pooling"
    assert json.loads(seen[0].content)["input"] == [
        "Q: What is 6*7? A: x",
        "Q: What is 6*7? A: y",
        "Q: What is 6*7? A: z",
    ]


@pytest.mark.parametrize(
    "handler",
    [
        json_response({"error": "boom"}, status=500),
        json_response({"nodata": []}),
        json_response({"data": [{"index": 0, "probs": [0.5, 0.5]}]}),  # one score for two candidates
        json_response({"data": [{"index": 0, "probs": ["x"]}, {"index": 1, "probs": []}]}),
        lambda _req: httpx.Response(200, content=b"not json"),
    ],
)
async def test_reward_model_bad_responses(handler: Callable[[httpx.Request], httpx.Response]) -> None:
    async with mock_client(handler, []) as http:
        with pytest.raises(VerifierError):
            await create_verifier("reward_model", RM).score(VerifyContext(request=REQUEST, http=http), draws("a", "b"))


async def test_reward_model_never_reflects_the_targets_body() -> None:
    async with mock_client(json_response({"keys": ["ttc-secret-key"]}, status=401), []) as http:
        with pytest.raises(VerifierError) as info:
            await create_verifier("reward_model", RM).score(VerifyContext(request=REQUEST, http=http), draws("a"))
    assert "answered 401" in str(info.value) and "secret" not in str(info.value)


async def test_reward_model_connection_error() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    async with mock_client(refuse, []) as http:
        with pytest.raises(VerifierError, match="unreachable"):
            await create_verifier("reward_model", RM).score(VerifyContext(request=REQUEST, http=http), draws("a"))


async def test_reward_model_needs_client() -> None:
    with pytest.raises(VerifierError, match="HTTP client"):
        await create_verifier("reward_model", RM).score(VerifyContext(request=REQUEST), draws("a"))


# --- LLM judge ----------------------------------------------------------------------------------


class FakeJudge:
    """A SampleSource that answers from a table keyed by candidate text and records its calls."""

    def __init__(self, replies: dict[str, str]) -> None:
        self.replies = replies
        self.calls: list[tuple[SamplingRequest, int]] = []
        self.in_flight = 0
        self.max_in_flight = 0

    async def draw(
        self, request: SamplingRequest, n: int, *, seed: int | None = None, max_tokens: int | None = None
    ) -> DrawResult:
        self.calls.append((request, n))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(0.01)
        self.in_flight -= 1
        content = str((request.messages or [{}])[0]["content"])
        reply = next(r for key, r in self.replies.items() if content.endswith(key))
        return DrawResult([Draw(reply)], Usage(prompt_tokens=100, completion_tokens=10))


@pytest.mark.parametrize(
    ("text", "score"),
    [
        ("Looks right.\nScore: 8", 0.8),
        ("Score: 3 ... on reflection Score: 10", 1.0),
        ("**Score:** 7", 0.7),
        ("I'd give it 4 out of 10", 1.0),  # last number: 10 -> 1.0
        ("Score: 15", 1.0),
        ("Score: -2", 0.0),
        ("no idea", 0.0),
    ],
)
def test_parse_judgement(text: str, score: float) -> None:
    assert parse_judgement(text) == pytest.approx(score)


async def test_llm_judge() -> None:
    judge = FakeJudge({"cand-A": "Correct.\nScore: 9", "cand-B": "Wrong. Score: 2", "cand-C": "hmm"})
    verifier = create_verifier("llm_judge", {"max_tokens": 32})
    ctx = VerifyContext(request=REQUEST, generator=judge)
    result = await verifier.score(ctx, draws("cand-A", "cand-B", "cand-C"))
    assert result.scores == pytest.approx([0.9, 0.2, 0.0])
    assert result.usage == Usage(prompt_tokens=300, completion_tokens=30)
    assert judge.max_in_flight == 3  # judged concurrently
    request, n = judge.calls[0]
    assert n == 1
    assert request.kind == "chat" and request.model == "gen-model"
    assert request.params == {"temperature": 0.0, "max_tokens": 32}
    content = (request.messages or [{}])[0]["content"]
    assert content.startswith(DEFAULT_RUBRIC)
    assert "What is 6*7?" in content and content.endswith("cand-A")


async def test_llm_judge_needs_generator() -> None:
    with pytest.raises(VerifierError, match="generator"):
        await create_verifier("llm_judge").score(VerifyContext(request=REQUEST), draws("a"))


# ---- likelihood ------------------------------------------------------------------------------------


def test_likelihood_scores_the_whole_completion_probability() -> None:
    verifier = create_verifier("likelihood")
    assert verifier.needs_logprobs and not verifier.needs_reference
    cands = [Draw(text="a", tokens=10, logprob=-0.01), Draw(text="b", tokens=40, logprob=-0.05),
             Draw(text="c", tokens=0, logprob=-3.0)]
    result = asyncio.run(verifier.score(VerifyContext(request=REQUEST), cands))
    assert result.scores == pytest.approx([math.exp(-0.1), math.exp(-2.0), 1.0])
    assert result.usage.completion_tokens == 0 and result.usage.prompt_tokens == 0


def test_a_likelihood_temperature_divides_the_summed_log_prob() -> None:
    cands = [Draw(text="a", tokens=100, logprob=-0.03), Draw(text="b", tokens=10, logprob=-0.03)]
    hot = asyncio.run(create_verifier("likelihood", {"temperature": 3.0}).score(VerifyContext(request=REQUEST), cands))
    assert hot.scores == pytest.approx([math.exp(-1.0), math.exp(-0.1)])
    for bad in (0.0, -1.0, 101.0):
        with pytest.raises(ValidationError):
            create_verifier("likelihood", {"temperature": bad})


def test_likelihood_min_scores_the_least_likely_token_and_extends_a_partial_solution() -> None:
    verifier = create_verifier("likelihood", {"aggregate": "min"})
    cands = [Draw(text="a", tokens=10, logprob=-0.01, min_logprob=-0.05),
             Draw(text="b", tokens=40, logprob=-0.01, min_logprob=-4.0)]
    result = asyncio.run(verifier.score(VerifyContext(request=REQUEST), cands))
    assert result.scores == pytest.approx([math.exp(-0.05), math.exp(-4.0)])  # one slip, not the length, decides
    extend = verifier.extend  # type: ignore[attr-defined]
    assert extend(0.5, cands[0]) == pytest.approx(0.5)  # a partial solution keeps its lowest token
    assert extend(0.5, cands[1]) == pytest.approx(math.exp(-4.0))
    summed = create_verifier("likelihood").extend  # type: ignore[attr-defined]
    assert summed(0.5, cands[0]) == pytest.approx(0.5 * math.exp(-0.1))  # sum: probabilities multiply
    lenient = create_verifier("likelihood", {"aggregate": "min", "missing": "unweighted"}).extend  # type: ignore[attr-defined]
    assert lenient(0.7, Draw(text="c", tokens=3)) == 0.7
    with pytest.raises(ValidationError):
        create_verifier("likelihood", {"aggregate": "mean"})


def test_likelihood_without_logprobs_is_a_verifier_error() -> None:
    verifier = create_verifier("likelihood")
    with pytest.raises(VerifierError, match="log-probs"):
        asyncio.run(verifier.score(VerifyContext(request=REQUEST), [Draw(text="a", tokens=5)]))
    with pytest.raises(VerifierError, match="log-probs"):
        asyncio.run(create_verifier("likelihood", {"aggregate": "min"}).score(
            VerifyContext(request=REQUEST), [Draw(text="a", tokens=5, logprob=-0.1)]))


def test_a_prm_input_template_is_kept_as_written_and_checked() -> None:
    """The template is validated with the reward model's rules ({steps} standing for {response}) but kept
    as written: a validator that returned the rewritten text sent the PRM "{response}" instead of the
    steps, and every solution came back with no scores."""
    from app.verifiers.prm import PRMParams

    params = PRMParams(url="http://prm", model="prm", input_template="Q: {prompt}\nA:\n{steps}")
    assert params.input_template == "Q: {prompt}\nA:\n{steps}"
    with pytest.raises(ValueError):
        PRMParams(url="http://prm", model="prm", input_template="{0}")
