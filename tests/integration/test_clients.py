"""Real client libraries against the service on the real vLLM CPU engine: the openai SDK (models,
log-probs, structured outputs, streaming, errors, request ids) and langchain-openai (structured
output by JSON schema and by function calling), plus what a request without a ``ttc`` block costs.

The demo model has a one-token-per-character tokenizer and was trained on arithmetic only. Under
vLLM's JSON guided decoding it pads with whitespace (which the grammar allows) until ``max_tokens``;
a frequency penalty makes repeated whitespace unlikely, and then it writes a complete JSON object
(whose number is rarely the sum: it has never seen JSON) in well under 64 tokens.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import openai
import pytest
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

from tests.integration.conftest import MODEL_NAME, Stack

QUESTION = "What is 512 + 37?"
MESSAGES: list[Any] = [{"role": "user", "content": QUESTION}]
WORKED = re.compile(r"^512 \+ 37 = \d+\nThe answer is \d+\.$")  # the demo model's answer to QUESTION
HARD_QUESTION = "What is 463 - 87 - 25 + 39?"  # the demo model is unsure of its greedy answer to this one
ANSWER_LINE = re.compile(r"\nThe answer is -?\d+\.$")
EOS = "</s>"  # the demo model's end-of-sequence token, which vLLM lists among a finished sample's log-probs


def few(n: int = 2, **ttc: Any) -> dict[str, Any]:
    """extra_body: a fixed number of samples in one round (keeps the shared vLLM servers free)."""
    return {"ttc": {"policy": {"allocator": "fixed", "params": {"n": n}}, **ttc}}


JSON_SAMPLING: dict[str, Any] = {"max_tokens": 64, "temperature": 0.8, "frequency_penalty": 2.0}


class Answer(BaseModel):
    answer: int


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@pytest.fixture(scope="module")
def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.service_url + "/v1", api_key="unused", timeout=120, max_retries=0)


def ttc_of(obj: Any) -> dict[str, Any]:
    extra = obj.model_extra or {}
    assert "ttc" in extra, f"no ttc block in {obj!r}"
    return extra["ttc"]


# --- openai SDK ---------------------------------------------------------------------------------


def test_models_retrieve_and_unknown_model(client: openai.OpenAI) -> None:
    model = client.models.retrieve(MODEL_NAME)
    assert model.id == MODEL_NAME and model.object == "model"
    assert MODEL_NAME in [m.id for m in client.models.list()]
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("no-such-model")
    assert info.value.status_code == 404


def test_logprobs_are_the_selected_samples(client: openai.OpenAI) -> None:
    chat = client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=48, temperature=1.0, logprobs=True, top_logprobs=2,
        extra_body=few(3, return_samples=True))
    choice = chat.choices[0]
    content = choice.message.content
    assert content and WORKED.match(content), content
    assert choice.finish_reason == "stop"
    assert choice.logprobs is not None and choice.logprobs.content, choice.logprobs
    entries = choice.logprobs.content
    for entry in entries:
        assert 1 <= len(entry.top_logprobs) <= 2, entry
        assert entry.logprob <= 0.0
    tokens = [e.token for e in entries]
    # vLLM lists the end-of-sequence token of a finished sample; the content is every token before it
    assert tokens[-1] == EOS, tokens[-3:]
    assert "".join(tokens[:-1]) == content
    # ...and they are the selected sample's log-probs, not another sample's
    ttc = ttc_of(chat)
    sample = ttc["samples"][ttc["selected_index"]]
    assert sample["text"] == content
    assert sample["tokens"] == len(entries)
    assert math.isclose(sample["logprob"], sum(e.logprob for e in entries) / len(entries), rel_tol=1e-6)


def test_no_logprobs_unless_asked(client: openai.OpenAI) -> None:
    # `confident` scores samples by their likelihood: the service asks vLLM for log-probs itself,
    # which must not leak into a response that did not ask for them
    chat = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=48,
                                          extra_body={"ttc": {"policy": "confident",
                                                              "budget": {"max_samples": 3}}})
    assert chat.choices[0].logprobs is None
    assert ttc_of(chat)["policy"]["name"] == "confident"
    plain = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=48, extra_body=few(1))
    assert plain.choices[0].logprobs is None


def test_parse_pydantic_response_format(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.parse(
        model=MODEL_NAME, messages=MESSAGES, response_format=Answer, extra_body=few(4, return_samples=True),
        **JSON_SAMPLING)
    completion = raw.parse()
    message = completion.choices[0].message
    assert isinstance(message.parsed, Answer), message
    assert isinstance(message.parsed.answer, int)
    assert json.loads(message.content or "") == {"answer": message.parsed.answer}
    ttc = ttc_of(completion)
    assert ttc["answer_kind"] == "json"
    assert ttc["answer"] == canonical({"answer": message.parsed.answer})  # votes are on canonical JSON
    assert ttc["answer"] in ttc["votes"]
    for key in ttc["votes"]:
        assert isinstance(json.loads(key)["answer"], int), ttc["votes"]
    assert raw.headers["x-request-id"] == ttc["request_id"]


def test_json_schema_response_format_create(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
              "additionalProperties": False}
    chat = client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, extra_body=few(3),
        response_format={"type": "json_schema", "json_schema": {"name": "Answer", "schema": schema, "strict": True}},
        **JSON_SAMPLING)
    value = json.loads(chat.choices[0].message.content or "")
    assert set(value) == {"answer"} and isinstance(value["answer"], int)
    ttc = ttc_of(chat)
    assert ttc["answer_kind"] == "json" and ttc["answer"] == canonical(value)


def test_stream_matches_non_streamed(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 48, "temperature": 1.0,
                              "seed": 5, "extra_body": few(2)}
    plain = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    assert chunks and all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert WORKED.match(text), text
    assert text == plain.choices[0].message.content  # same seed, same samples, same selection
    assert chunks[-1].choices[0].finish_reason == "stop"
    final = ttc_of(chunks[-1])
    assert final["votes"] == ttc_of(plain)["votes"] and final["samples_drawn"] == 2


def test_stream_unknown_model_raises_at_the_call(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES, max_tokens=8, stream=True)
    body = info.value.body
    assert isinstance(body, dict) and body.get("param") == "model", body
    assert body.get("code") == "model_not_found"


@pytest.mark.parametrize(("kwargs", "param"), [({"extra_body": {"best_of": 2}}, "best_of"), ({"n": 2}, "n")])
def test_refused_fields_are_bad_requests(client: openai.OpenAI, kwargs: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=8, **kwargs)
    body = info.value.body
    assert isinstance(body, dict) and body.get("param") == param, body
    assert param in str(body.get("message"))


def test_request_id_header_round_trips(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=48, extra_body=few(1),
        extra_headers={"x-request-id": "clients-test.42"})
    assert raw.headers["x-request-id"] == "clients-test.42"
    assert ttc_of(raw.parse())["request_id"] == "clients-test.42"


def test_plain_request_uses_the_default_policy(client: openai.OpenAI) -> None:
    """No ttc block: the built-in `default` policy, at most 4 samples."""
    chat = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=48)
    assert chat.choices[0].message.content and WORKED.match(chat.choices[0].message.content)
    ttc = ttc_of(chat)
    assert ttc["policy"]["name"] == "default", ttc["policy"]
    assert 1 <= ttc["samples_drawn"] <= 4 and ttc["max_samples"] <= 4, ttc


GREEDY_CASES = [
    # no ttc block: the default policy draws one sample, then rounds of two while it is unsure (it is, here)
    pytest.param(HARD_QUESTION, None, False, id="default-policy"),
    pytest.param(HARD_QUESTION, None, True, id="default-policy-stream"),
    pytest.param(QUESTION, {"ttc": {"policy": "self-consistency-8"}}, False, id="self-consistency-8"),
]


@pytest.mark.parametrize(("question", "extra_body", "stream"), GREEDY_CASES)
def test_greedy_request_is_answered(client: openai.OpenAI, question: str, extra_body: dict[str, Any] | None,
                                    stream: bool) -> None:
    """temperature 0 (what many clients send for determinism) is an ordinary request: the client asked
    for neither n nor several samples per backend call, and vLLM refuses n > 1 with greedy sampling, so
    that is the service's to handle (one sample, or n=1 calls), not a 400 or an error event mid-stream."""
    kwargs: dict[str, Any] = {"model": MODEL_NAME, "messages": [{"role": "user", "content": question}],
                              "max_tokens": 80, "temperature": 0, "extra_body": extra_body}
    if stream:
        # an {"error": ...} event after the first round makes the SDK raise openai.APIError here
        chunks = list(client.chat.completions.create(stream=True, **kwargs))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        ttc = ttc_of(chunks[-1])
    else:
        chat = client.chat.completions.create(**kwargs)
        text = chat.choices[0].message.content or ""
        ttc = ttc_of(chat)
    assert ANSWER_LINE.search(text), text
    assert ttc["samples_drawn"] >= 1


# --- langchain-openai ---------------------------------------------------------------------------


def chat_model(stack: Stack, **kwargs: Any) -> ChatOpenAI:
    return ChatOpenAI(base_url=stack.service_url + "/v1", api_key="unused", model=MODEL_NAME,
                      timeout=120, max_retries=0, **kwargs)


def test_langchain_plain_and_json_schema(stack: Stack) -> None:
    plain = chat_model(stack, max_tokens=48, extra_body=few(2)).invoke(QUESTION)
    assert isinstance(plain.content, str) and WORKED.match(plain.content), plain.content

    llm = chat_model(stack, extra_body=few(4), **JSON_SAMPLING)
    out = llm.with_structured_output(Answer, method="json_schema", include_raw=True).invoke(QUESTION)
    assert out["parsing_error"] is None, out
    parsed = out["parsed"]
    assert isinstance(parsed, Answer) and isinstance(parsed.answer, int)
    # a real JSON answer from the model, not a number read out of prose
    assert json.loads(out["raw"].content) == {"answer": parsed.answer}


def test_langchain_function_calling_is_refused_clearly(stack: Stack) -> None:
    """The service forwards tools/tool_choice to vLLM; the engine here runs without a tool-call parser,
    so a named tool choice is refused: a 400 that names tool_choice, never a made-up tool call."""
    llm = chat_model(stack, extra_body=few(2), **JSON_SAMPLING)
    with pytest.raises(openai.BadRequestError) as info:
        llm.with_structured_output(Answer, method="function_calling").invoke(QUESTION)
    assert info.value.status_code == 400
    body = info.value.body
    assert isinstance(body, dict) and "tool_choice" in str(body.get("message")), body
