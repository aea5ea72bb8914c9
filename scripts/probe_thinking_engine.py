#!/usr/bin/env python
"""Probe what a vLLM engine serving the thinking demo model does with reasoning: response fields, token
accounting, ``thinking_token_budget``, log-probs, ``/v1/completions``, ``max_tokens`` inside the thought,
``chat_template_kwargs``, structured outputs (``response_format``, ``parse()``, LangChain) and throughput.

Run it with the service venv (it needs ``openai`` and ``langchain-openai``) against a running engine
started as the model card says (``--reasoning-parser qwen3``)::

    .venv/bin/python scripts/probe_thinking_engine.py --url http://127.0.0.1:18451 \\
        --out models/arith-thinker/engine_facts.json

Every check prints one line and stores the request and the relevant part of the reply under its name
in the JSON (the model card's "Serving facts" section is written from it). Nothing here asserts: the
point is to record what this engine version does.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ttc_tools.demo.thinking import completion_prompt, make_set  # noqa: E402

NAME = "arith-thinker"
Q1 = "What is 684 - 80?"  # level 1: a ~100-token thought
FACTS: dict[str, dict] = {}


def record(name: str, request: dict, **found: object) -> None:
    FACTS[name] = {"request": request, **found}
    print(f"{name}: " + json.dumps(found, default=str)[:600], flush=True)


def chat(c: httpx.Client, **kw: object) -> dict:
    payload = {"model": NAME, "messages": [{"role": "user", "content": kw.pop("question", Q1)}], **kw}
    r = c.post("/v1/chat/completions", json=payload)
    return {"status": r.status_code, "body": r.json() if r.headers.get("content-type", "").startswith(
        "application/json") else r.text, "payload": payload}


def stream(c: httpx.Client, **kw: object) -> dict:
    """A streamed chat call: the delta keys seen, the concatenated reasoning/content per choice, the
    finish reasons and the usage chunk."""
    payload = {"model": NAME, "messages": [{"role": "user", "content": kw.pop("question", Q1)}], "stream": True,
               "stream_options": {"include_usage": True}, **kw}
    keys: set[str] = set()
    reasoning: dict[int, str] = {}
    content: dict[int, str] = {}
    finish: dict[int, str | None] = {}
    usage = None
    chunks = 0
    with c.stream("POST", "/v1/chat/completions", json=payload) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            chunks += 1
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices", []):
                d = ch.get("delta", {})
                keys |= {k for k, v in d.items() if v is not None}
                i = ch["index"]
                for k in ("reasoning", "reasoning_content"):
                    if d.get(k):
                        reasoning[i] = reasoning.get(i, "") + d[k]
                if d.get("content"):
                    content[i] = content.get(i, "") + d["content"]
                if ch.get("finish_reason"):
                    finish[i] = ch["finish_reason"]
    return {"delta_keys": sorted(keys), "reasoning": reasoning, "content": content, "finish": finish,
            "usage": usage, "chunks": chunks, "payload": payload}


def msg_summary(body: dict) -> list[dict]:
    out = []
    for ch in body["choices"]:
        m = ch["message"]
        out.append({"keys": sorted(k for k, v in m.items() if v is not None),
                    "reasoning_len": len(m.get("reasoning") or ""), "reasoning_tail": (m.get("reasoning") or "")[-40:],
                    "content": m.get("content"), "finish_reason": ch["finish_reason"]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:18451")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--skip-throughput", action="store_true")
    args = ap.parse_args()
    c = httpx.Client(base_url=args.url, timeout=600)

    # (a) fields and token accounting, non-streamed and streamed (greedy: both give the same text)
    r = chat(c, temperature=0, max_tokens=400)
    b = r["body"]
    m = b["choices"][0]["message"]
    record("a_nonstream", r["payload"], message_keys=sorted(k for k, v in m.items() if v is not None),
           reasoning=m.get("reasoning"), content=m.get("content"), usage=b["usage"],
           reasoning_chars=len(m.get("reasoning") or ""), content_chars=len(m.get("content") or ""))
    s = stream(c, temperature=0, max_tokens=400)
    record("a_stream", s["payload"], delta_keys=s["delta_keys"], usage=s["usage"], chunks=s["chunks"],
           same_split_as_nonstream=(s["reasoning"].get(0) == m.get("reasoning") and s["content"].get(0) == m.get("content")),
           content=s["content"].get(0))

    # (b) thinking_token_budget: n=1 and n=4, streamed and not; level 4 thoughts are ~500 tokens
    q4 = make_set(1, [4], seed=99)[0].question
    for n in (1, 4):
        for budget in (0, 40, 200):
            r = chat(c, question=q4, n=n, temperature=1.0, max_tokens=1500, thinking_token_budget=budget)
            if r["status"] != 200:
                record(f"b_budget{budget}_n{n}", r["payload"], status=r["status"], error=r["body"])
                continue
            record(f"b_budget{budget}_n{n}", r["payload"], choices=msg_summary(r["body"]), usage=r["body"]["usage"])
        s = stream(c, question=q4, n=n, temperature=1.0, max_tokens=1500, thinking_token_budget=40)
        record(f"b_budget40_n{n}_stream", s["payload"], reasoning_lens={i: len(v) for i, v in s["reasoning"].items()},
               content=s["content"], finish=s["finish"], usage=s["usage"])
    r = chat(c, question=q4, temperature=1.0, max_tokens=1500)
    record("b_no_budget", r["payload"], choices=msg_summary(r["body"]), usage=r["body"]["usage"])

    # (c) log-probs with reasoning
    r = chat(c, temperature=1.0, max_tokens=400, logprobs=True, top_logprobs=2)
    b = r["body"]
    lp = (b["choices"][0].get("logprobs") or {}).get("content") or []
    toks = [e["token"] for e in lp]
    record("c_logprobs", r["payload"], n_logprob_entries=len(lp), completion_tokens=b["usage"]["completion_tokens"],
           first_tokens=toks[:6], think_end_in_logprobs="</think>" in toks,
           first_entry=lp[0] if lp else None)
    r = chat(c, temperature=1.0, max_tokens=400, logprobs=True, top_logprobs=2, include_reasoning=False)
    b = r["body"]
    record("c_logprobs_include_reasoning_false", r["payload"], status=r["status"],
           logprobs=None if r["status"] != 200 else b["choices"][0].get("logprobs"),
           message=None if r["status"] != 200 else msg_summary(b))

    # (d) /v1/completions with the raw prompt
    payload = {"model": NAME, "prompt": completion_prompt(Q1), "temperature": 0, "max_tokens": 400}
    b = c.post("/v1/completions", json=payload).json()
    ch = b["choices"][0]
    record("d_completions", payload, choice_keys=sorted(k for k, v in ch.items() if v is not None),
           text=ch["text"], usage=b["usage"])

    # (e) max_tokens reached inside the thought
    r = chat(c, question=q4, temperature=1.0, max_tokens=30)
    record("e_max_tokens_in_thought", r["payload"], choices=msg_summary(r["body"]), usage=r["body"]["usage"])
    s = stream(c, question=q4, temperature=1.0, max_tokens=30)
    record("e_max_tokens_in_thought_stream", s["payload"], reasoning=s["reasoning"], content=s["content"],
           finish=s["finish"], usage=s["usage"])

    # (f) chat_template_kwargs: thinking off
    r = chat(c, temperature=0, max_tokens=100, chat_template_kwargs={"enable_thinking": False})
    record("f_enable_thinking_false", r["payload"], status=r["status"],
           choices=msg_summary(r["body"]) if r["status"] == 200 else r["body"],
           usage=r["body"].get("usage") if r["status"] == 200 else None)

    # structured outputs: grammar only after </think>?
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
              "additionalProperties": False}
    for name, rf, question in (
        ("s_json_schema_no_cue", {"type": "json_schema", "json_schema": {"name": "Answer", "schema": schema}}, Q1),
        ("s_json_object_no_cue", {"type": "json_object"}, Q1),
        ("s_json_schema_level4", {"type": "json_schema", "json_schema": {"name": "Answer", "schema": schema}}, q4),
        ("s_cue_without_response_format", None, Q1 + " Answer in JSON."),
    ):
        kw: dict = {"question": question, "temperature": 1.0, "max_tokens": 1500, "n": 4}
        if rf:
            kw["response_format"] = rf
        r = chat(c, **kw)
        record(name, r["payload"], status=r["status"],
               choices=msg_summary(r["body"]) if r["status"] == 200 else r["body"])
    s = stream(c, temperature=1.0, max_tokens=600, response_format={"type": "json_object"})
    record("s_json_object_stream", s["payload"], reasoning_len={i: len(v) for i, v in s["reasoning"].items()},
           content=s["content"], finish=s["finish"])

    # the model's own choice after </think> (what a JSON grammar then masks): plain question and JSON cue
    for name, question in (("s_after_think_end_plain", Q1), ("s_after_think_end_cue", Q1 + " Answer in JSON.")):
        r = chat(c, question=question, temperature=0, max_tokens=400, logprobs=True, top_logprobs=5)
        lp = (r["body"]["choices"][0].get("logprobs") or {}).get("content") or []
        at = next((i for i, e in enumerate(lp) if e["token"] == "</think>"), None)
        record(name, r["payload"], content=r["body"]["choices"][0]["message"].get("content"),
               top_after_think_end=None if at is None or at + 1 >= len(lp) else
               {e["token"]: round(math.exp(e["logprob"]), 4) for e in lp[at + 1]["top_logprobs"]})

    from openai import OpenAI
    from pydantic import BaseModel

    class Answer(BaseModel):
        answer: int

    client = OpenAI(base_url=args.url + "/v1", api_key="unused")
    t0 = time.monotonic()
    resp = client.chat.completions.parse(model=NAME, messages=[{"role": "user", "content": Q1}],
                                         response_format=Answer, temperature=1.0, max_tokens=1500)
    msg = resp.choices[0].message
    record("s_openai_parse", {"response_format": "pydantic Answer(answer: int)", "question": Q1},
           parsed=msg.parsed.model_dump() if msg.parsed else None, content=msg.content,
           reasoning_len=len((msg.model_extra or {}).get("reasoning") or ""), seconds=round(time.monotonic() - t0, 2))
    try:
        from langchain_openai import ChatOpenAI

        llm = ChatOpenAI(model=NAME, base_url=args.url + "/v1", api_key="unused", temperature=1.0, max_tokens=1500)
        out = {m: llm.with_structured_output(Answer, method=m).invoke(Q1) for m in ("json_schema", "json_mode")}
        record("s_langchain_with_structured_output", {"schema": "pydantic Answer(answer: int)", "question": Q1},
               results={k: (v.model_dump() if v is not None else None) for k, v in out.items()})
    except Exception as e:  # recorded, not fatal: the point is to know
        record("s_langchain_with_structured_output", {"question": Q1}, error=repr(e)[:400])

    # (g) throughput: n=8 and n=16 samples of ~500 tokens (level 4), one request and 4 concurrent
    if not args.skip_throughput:
        qs = [p.question for p in make_set(8, [4], seed=77)]
        for n in (8, 16):
            for conc in (1, 4):
                t0 = time.monotonic()

                def one(q: str, n: int = n) -> dict:
                    return chat(c, question=q, n=n, temperature=1.0, max_tokens=1500)["body"]["usage"]

                with ThreadPoolExecutor(conc) as ex:
                    usages = list(ex.map(one, qs[:conc]))
                secs = time.monotonic() - t0
                toks = sum(u["completion_tokens"] for u in usages)
                record(f"g_throughput_n{n}_conc{conc}", {"n": n, "concurrent_requests": conc, "level": 4},
                       seconds=round(secs, 2), completion_tokens=toks, tokens_per_s=round(toks / secs),
                       mean_tokens_per_sample=round(toks / (n * conc)))

    if args.out:
        args.out.write_text(json.dumps(FACTS, indent=2, default=str) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
