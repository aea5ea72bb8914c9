"""A fixed-latency fake OpenAI server (ASGI) for benchmarks, load-test tests and API tests.

For each call it sleeps ``latency_s`` then returns ``n`` choices. Each choice ends with
"The answer is X." where X is the prompt's *true* answer (the last integer in the prompt, or 42)
with probability ``p_correct``, else a wrong neighbour. ``style`` changes what a choice says around
its number X (for load tests of answer handling): ``number`` (the default above), ``math``
(``\boxed{\frac{x}{X}}``), ``code`` (a one-line Python function that uses X) or ``prose`` ("Final
answer: " and 30 words that depend on X). Asked for ``response_format`` JSON it answers
``{"answer": X, "unit": "none"}`` (key order and spacing vary); given ``tools`` (and no
``tool_choice: "none"``) it calls the first tool with ``{"x": X}``. A prompt containing
``truncate=K`` makes the first K choices of each call stop at their length limit
(``finish_reason: length``) on a wrong number. Draws are deterministic for a request
``seed``. Asked for ``logprobs``, each of a choice's 9 tokens reports log-prob -0.01 when the answer
is right and -0.2 when it is wrong (a model that is surer of its right answers; with
``logprobs=False`` it never reports them). It counts calls and can be told to fail calls
(``fail_status``) or health checks (``healthy``).

Asked to ``stream``, it sends the choices as server-sent chunks of one token each, interleaved,
``token_latency_s`` apart per step, then a usage chunk (with vLLM's ``stream_interval`` K, a
choice's chunk comes at its first token, then every K tokens, and at its last, carrying the tokens
since); a prompt containing ``spread=K`` makes each sample ``9 + U{0..K}`` tokens long (cut at
``max_tokens``). It counts streams started, open, finished, cancelled (the client closed the
connection mid-way) and broken (``break_after``), samples started, finished and cancelled, the
tokens it sent, the chunks (``events``) they came in and the prompt tokens of its calls (counted as
a call arrives, as vLLM's counter counts a prefill); ``GET /fake/stats`` returns them. Asked for
``stream_options.continuous_usage_stats`` (vLLM's option), every chunk carries the running usage.
With ``reasoning_field`` a chat call that continues the assistant's unfinished turn
(``continue_final_message``: a probe of a running thought) answers one short line with the true answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any

from starlette.types import Receive, Scope, Send
from ttc_monitor.args import parse
from ttc_monitor.window import first_cut, token_confidence

_INT = re.compile(r"-?\d+")


@dataclass
class FakeOpenAI:
    latency_s: float = 0.0
    p_correct: float = 0.7
    model: str = "fake-model"
    fail_status: int | None = None
    healthy: bool = True
    calls: int = 0
    samples: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    keep_bodies: bool = False
    logprobs: bool = True
    style: str = "number"
    token_latency_s: float = 0.0
    break_after: int | None = None
    """Streams: drop the connection after this many tokens (a backend dying mid-stream)."""
    stall_after: int | None = None
    load_waiting: int = 0
    """What ``GET /metrics`` says of requests waiting (vLLM's ``num_requests_waiting``): > 0 is a
    saturated server; requests running are the samples in flight, KV-cache use ``load_kv``."""
    load_kv: float = 0.0
    cuts: bool = True
    """It cuts traces the way vLLM with the ``ttc_monitor`` plugin does: ``POST /tokenize`` knows the
    marker ``<unk>`` (id :data:`MARKER`), and a call whose ``vllm_xargs`` ask for a monitor has each choice
    end, on the marker, at its first token whose group confidence is under the threshold (each token's
    confidence from the alternatives its log-probs report; ``finish_reason: stop``, ``stop_reason``: the
    marker). ``False``: an engine without the plugin (it ignores the arguments)."""
    reasoning_field: str | None = None
    """Chat: each choice also carries a thought of :data:`THOUGHT_TOKENS` tokens in this field
    (``reasoning`` as vLLM names it, or the older ``reasoning_content``); the thought mentions a wrong
    number, which must never vote. With ``truncate=K`` the first K choices stop inside their thought."""
    """Streams: samples after the first ``stall_after`` send one token, then nothing until the client
    leaves (their stream hangs)."""
    streams: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("started", "open", "max_open", "finished", "cancelled", "tokens", "samples_started", "samples_finished",
         "samples_cancelled", "broken", "prompt_tokens", "probes", "probe_tokens", "events", "cut_probes"), 0))

    def _prompt_text(self, body: dict[str, Any]) -> str:
        if "messages" in body:
            return " ".join(str(m.get("content", "")) for m in body["messages"])
        prompt = body.get("prompt", "")
        return prompt if isinstance(prompt, str) else " ".join(map(str, prompt))

    def completion(self, body: dict[str, Any], chat: bool) -> dict[str, Any]:
        n = int(body.get("n") or 1)
        text = self._prompt_text(body)
        ints = _INT.findall(text)
        truth = int(ints[-1]) if ints else 42
        rng = random.Random(body["seed"]) if body.get("seed") is not None else random.Random()
        p = self.p_correct
        m = re.search(r"p_correct=([0-9.]+)", text)
        if m:
            p = float(m.group(1))
        t = re.search(r"truncate=(\d+)", text)
        truncate = int(t.group(1)) if t else 0
        k = re.search(r"think=(\d+)", text)
        think = int(k.group(1)) if k else THOUGHT_TOKENS
        if chat and self.reasoning_field and body.get("continue_final_message"):  # the asked question's truth
            asked = _INT.findall(" ".join(str(m.get("content", "")) for m in body["messages"][:-1]))
            return self._probe(body, int(asked[-1]) if asked else 42)
        fmt = (body.get("response_format") or {}).get("type")
        tools = body.get("tools") if body.get("tool_choice") != "none" else None
        choices = []
        cuts: list[int | None] = []
        lps: list[float] = []
        """Each choice's token log-prob (a stream cuts its longer samples with it: :meth:`_pieces`)."""
        per = 9
        for i in range(n):
            ans = truth if rng.random() < p else truth + rng.choice([-2, -1, 1, 2, 10])
            lps.append(-0.01 if ans == truth else -0.2)
            cuts.append(self.cut_at(body, lps[-1], per))
            finish = "stop"
            if i < truncate:  # cut mid-way: "... The answer is 51" of a wrong, unfinished line
                ans, finish = truth + 19, "length"
            content: str | None = styled(self.style, ans)
            calls = None
            if fmt in ("json_object", "json_schema"):
                content = json.dumps({"answer": ans, "unit": "none"} if rng.random() < 0.5 else
                                     {"unit": "none", "answer": ans}, indent=rng.choice([None, 2]))
            if tools:
                name = tools[0].get("function", {}).get("name", "f")
                calls = [{"id": f"call_{i}", "type": "function",
                          "function": {"name": name, "arguments": json.dumps({"x": ans})}}]
                content, finish = None, "tool_calls"
            logprobs = None
            if body.get("logprobs") and self.logprobs:
                top = int(body.get("top_logprobs") or 0) if chat else max(0, int(body["logprobs"]) - 1)
                logprobs = _logprobs(-0.01 if ans == truth else -0.2, per, chat, top)
            if chat:
                message: dict[str, Any] = {"role": "assistant", "content": content}
                if self.reasoning_field:
                    message[self.reasoning_field] = thought_of(truth, cut=finish == "length", length=think)
                    if finish == "length":
                        message["content"] = None
                if calls:
                    message["tool_calls"] = calls
                choices.append({"index": i, "message": message, "finish_reason": finish, "logprobs": logprobs})
            else:
                choices.append({"index": i, "text": content, "finish_reason": finish, "logprobs": logprobs})
        thought = think * n if chat and self.reasoning_field else 0
        generated = per * n + thought - _apply_cuts(choices, lps, cuts, per, chat)
        usage: dict[str, Any] = {"prompt_tokens": max(1, len(text) // 4), "completion_tokens": generated,
                                 "total_tokens": max(1, len(text) // 4) + generated}
        if thought:
            usage["completion_tokens_details"] = {"reasoning_tokens": thought}
        return {
            "id": f"fake-{self.calls}", "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": body.get("model", self.model), "choices": choices,
            "usage": usage,
        }

    def cut_at(self, body: dict[str, Any], lp: float, tokens: int) -> int | None:
        """Where the engine's monitor would end a choice of ``tokens`` tokens of log-prob ``lp`` each
        (each token's confidence over its ``top_k`` alternatives, as its log-probs report them), ``None``:
        not cut (or no monitor asked for, or :attr:`cuts` off)."""
        args = parse(body.get("vllm_xargs") or {}, body.get("stop_token_ids") or []) if self.cuts else None
        if args is None:
            return None
        c = token_confidence(_alternatives(lp, args.top_k)) or 0.0
        return first_cut([c] * tokens, args.window, args.threshold)

    def _probe(self, body: dict[str, Any], truth: int) -> dict[str, Any]:
        """A probe of a running thought (the assistant's unfinished turn continued): one answer line of
        :data:`PROBE_TOKENS` tokens, the true answer, in the thought field (as vLLM's parser puts a
        continuation that never closes a thought); counted in ``probes``."""
        self.streams["probes"] += 1
        self.streams["probe_tokens"] += PROBE_TOKENS
        message = {"role": "assistant", "content": None, self.reasoning_field or "reasoning": f"The answer is {truth}."}
        prompt = max(1, len(self._prompt_text(body)) // 4)
        return {"id": f"fake-{self.calls}", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model", self.model),
                "choices": [{"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}],
                "usage": {"prompt_tokens": prompt, "completion_tokens": PROBE_TOKENS,
                          "total_tokens": prompt + PROBE_TOKENS,
                          "completion_tokens_details": {"reasoning_tokens": PROBE_TOKENS}}}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        path, method = scope["path"], scope["method"]
        chunks = []
        while True:
            msg = await receive()
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body"):
                break
        raw = b"".join(chunks) or b"{}"
        if method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            answer = await self._generate(json.loads(raw), path.endswith("chat/completions"), receive, send)
            if answer is None:
                return  # streamed
            status, payload = answer
        else:
            status, payload = self._control(method, path, raw)
        data = payload["__text__"].encode() if "__text__" in payload else json.dumps(payload).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})

    def _control(self, method: str, path: str, raw: bytes) -> tuple[int, dict[str, Any]]:
        """Health, models, statistics and the stall switch."""
        if method == "GET" and path == "/health":
            return (200, {}) if self.healthy else (503, {})
        if method == "POST" and path == "/tokenize":
            text = json.loads(raw).get("prompt", "")
            return 200, {"tokens": [MARKER] if text == "<unk>" else [ord(ch) % 100 for ch in text]}
        if method == "GET" and path == "/fake/stats":
            return 200, dict(self.streams)
        if method == "POST" and path == "/fake/stall":  # {"after": N | null}: set (or lift) stall_after
            after = json.loads(raw).get("after")
            self.stall_after = None if after is None else int(after)
            return 200, {"stall_after": self.stall_after}
        if method == "GET" and path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": self.model, "object": "model"}]}
        if method == "GET" and path == "/metrics":
            running = self.streams["samples_started"] - self.streams["samples_finished"] - \
                self.streams["samples_cancelled"]
            return 200, {"__text__": f"vllm:num_requests_running{{engine=\"0\"}} {max(0, running)}\n"
                                     f"vllm:num_requests_waiting{{engine=\"0\"}} {self.load_waiting}\n"
                                     f"vllm:kv_cache_usage_perc{{engine=\"0\"}} {self.load_kv}\n"}
        return 404, {"error": {"message": "not found"}}

    async def _generate(self, body: dict[str, Any], chat: bool, receive: Receive,
                        send: Send) -> tuple[int, dict[str, Any]] | None:
        """A completion call after the fixed latency: the injected failure, the answer, or (``None``)
        a stream already sent or a client that left during the latency. The service's check that the
        engine cuts traces (``user`` ``ttc-monitor-probe``) is answered at once and counted apart
        (``streams["cut_probes"]``), not among the calls, samples and bodies tests count."""
        if body.get("user") == "ttc-monitor-probe":
            self.streams["cut_probes"] += 1
            answer = self.completion(body, chat=chat)
            for c in answer["choices"]:
                c.pop("_lp", None)
            return 200, answer
        self.calls += 1
        if self.keep_bodies:
            self.bodies.append(body)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.latency_s:  # a client that leaves ends the wait (as a server aborts the request)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(_disconnected(receive), self.latency_s)
                    return None
        finally:
            self.in_flight -= 1
        if self.fail_status is not None:
            return self.fail_status, {"error": {"message": "injected failure"}}
        self.samples += int(body.get("n") or 1)
        if body.get("stream"):
            await self._stream(body, chat, receive, send)
            return None
        answer = self.completion(body, chat=chat)
        for c in answer["choices"]:
            c.pop("_lp", None)
        self.streams["prompt_tokens"] += answer["usage"]["prompt_tokens"]
        return 200, answer

    def _pieces(self, choice: dict[str, Any], body: dict[str, Any], chat: bool,
                rng: random.Random) -> tuple[list[tuple[str, bool]], str, Any, bool, int | None]:
        """How one choice is streamed: its token pieces (``(text, is_thought)``, the thought first), its
        finish reason, the log-prob object sent with each chunk, whether it stalls, and its stop reason
        (the marker when the monitor cut it)."""
        m = re.search(r"spread=(\d+)", self._prompt_text(body))
        limit = int(body.get("max_tokens") or 10**9)
        text = (choice["message"]["content"] if chat else choice["text"]) or ""
        thought = choice["message"].get(self.reasoning_field or "", "") if chat else ""
        n_tok = 9 + (rng.randrange(int(m.group(1)) + 1) if m else 0)
        finish = choice["finish_reason"]
        if n_tok > limit:
            n_tok, finish = limit, "length"
        lp = choice.get("logprobs") or {}
        lp_value = ({"content": (lp.get("content") or [])[:1]} if chat else
                    {k: v[:1] for k, v in lp.items() if isinstance(v, list)}) if lp else None
        stalls = self.stall_after is not None and self.streams["samples_started"] >= self.stall_after
        self.streams["samples_started"] += 1
        thinking = [(w + " ", True) for w in thought.split(" ")] if thought else []
        pieces = thinking + [(text[i * len(text) // n_tok:(i + 1) * len(text) // n_tok], False)
                             for i in range(n_tok if text or not thinking else 0)]
        if len(pieces) > limit:  # max_tokens counts the thought too
            pieces, finish = pieces[:limit], "length"
        at = self.cut_at(body, choice.pop("_lp", -0.01), len(pieces))
        if at is not None:  # the monitor forces the marker there: the sample ends on it, with no text
            return [("", False)] * (at + 1), "stop", lp_value, stalls, MARKER
        return pieces, finish, lp_value, stalls, None

    async def _stream(self, body: dict[str, Any], chat: bool, receive: Receive, send: Send) -> None:
        """The call's ``n`` choices as SSE chunks of one token each, interleaved step by step (as vLLM
        decodes them side by side); stops the moment the client disconnects."""
        n = int(body.get("n") or 1)
        full = self.completion(body, chat)
        plan = [self._pieces(choice, body, chat, rng) for rng in [random.Random(body.get("seed"))]
                for choice in full["choices"]]
        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.create_task(watch())
        st = self.streams
        st["started"] += 1
        st["prompt_tokens"] += full["usage"]["prompt_tokens"]  # prefilled on arrival, as vLLM counts it
        st["open"] += 1
        st["max_open"] = max(st["max_open"], st["open"])
        done = [False] * n
        sent = 0
        per_choice = [0] * n
        held: list[list[tuple[str, bool]]] = [[] for _ in range(n)]
        interval = int(body.get("stream_interval") or 1)
        prompt_tokens = full["usage"]["prompt_tokens"]
        continuous = bool((body.get("stream_options") or {}).get("continuous_usage_stats"))
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            for step in range(max(len(pieces) for pieces, *_ in plan)):
                if self.token_latency_s:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(gone.wait(), self.token_latency_s)
                if gone.is_set():
                    break
                if self.break_after is not None and step >= self.break_after:
                    st["broken"] = st.get("broken", 0) + 1
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    return
                for i, (pieces, finish, lp_value, stalls, stop) in enumerate(plan):
                    if step >= len(pieces) or (stalls and step > 0):
                        continue
                    last = step == len(pieces) - 1
                    sent += 1
                    per_choice[i] += 1  # vLLM's continuous usage: this choice's running count
                    st["tokens"] += 1
                    held[i].append(pieces[step])
                    # vLLM's stream_interval: a choice's first token, then every `interval` tokens, and its last
                    if not (last or per_choice[i] == 1 or len(held[i]) >= interval):
                        continue
                    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": per_choice[i],
                             "total_tokens": prompt_tokens + per_choice[i]} if continuous else None
                    if usage is not None and self.reasoning_field:  # vLLM with a reasoning parser counts thoughts
                        thought = sum(is_thought for _, is_thought in pieces[:step + 1])
                        usage["completion_tokens_details"] = {"reasoning_tokens": thought}
                    await send({"type": "http.response.body", "more_body": True,
                                "body": self._chunk(full, chat, i, held[i], finish if last else None, lp_value,
                                                    usage, self.reasoning_field, stop if last else None)})
                    st["events"] += 1
                    held[i] = []
                    if last:
                        done[i] = True
                        st["samples_finished"] += 1
            if not all(done):  # stalled samples: hang until the client leaves
                await gone.wait()
            if gone.is_set():
                st["cancelled"] += 1
                st["samples_cancelled"] += done.count(False)
                return
            usage = {"prompt_tokens": full["usage"]["prompt_tokens"], "completion_tokens": sent,
                     "total_tokens": full["usage"]["prompt_tokens"] + sent}
            thought_sent = sum(1 for pieces, *_ in plan for _, is_thought in pieces if is_thought)
            if thought_sent:
                usage["completion_tokens_details"] = {"reasoning_tokens": thought_sent}
            tail = {"id": full["id"], "object": "chat.completion.chunk" if chat else "text_completion",
                    "model": full["model"], "choices": [], "usage": usage}
            await send({"type": "http.response.body", "more_body": True,
                        "body": b"data: " + json.dumps(tail).encode() + b"\n\n"})
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
            st["finished"] += 1
        finally:
            st["open"] -= 1
            watcher.cancel()

    @staticmethod
    def _chunk(full: dict[str, Any], chat: bool, index: int, pieces: list[tuple[str, bool]], finish: str | None,
               logprobs: dict[str, Any] | None, usage: dict[str, int] | None = None,
               reasoning_field: str | None = None, stop_reason: int | None = None) -> bytes:
        """One choice's chunk of ``pieces`` (its tokens since the last chunk: thought first, then text),
        with one log-prob entry per token."""
        thought = "".join(text for text, is_thought in pieces if is_thought)
        text = "".join(text for text, is_thought in pieces if not is_thought)
        delta = {**({(reasoning_field or "reasoning"): thought} if thought else {}),
                 **({"content": text} if text or not thought else {})}
        c: dict[str, Any] = {"index": index, "delta": delta} if chat else {"index": index, "text": text}
        if logprobs:
            logprobs = {k: v * len(pieces) for k, v in logprobs.items()}
        c.update(finish_reason=finish, logprobs=logprobs)
        if stop_reason is not None:
            c["stop_reason"] = stop_reason
        chunk: dict[str, Any] = {"id": full["id"], "object": "chat.completion.chunk" if chat else "text_completion",
                                 "model": full["model"], "choices": [c]}
        if usage is not None:  # vLLM's stream_options.continuous_usage_stats: the running totals on every chunk
            chunk["usage"] = usage
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def _apply_cuts(choices: list[dict[str, Any]], lps: list[float], cuts: list[int | None], per: int, chat: bool) -> int:
    """End each cut choice on the marker (the monitor's stop token: no answer, ``at + 1`` tokens) and keep
    each choice's token log-prob for a stream (``_lp``); the tokens the cuts saved."""
    saved = 0
    for c, lp, at in zip(choices, lps, cuts, strict=True):
        c["_lp"] = lp
        if at is not None:
            c.update(finish_reason="stop", stop_reason=MARKER)
            c["message" if chat else "text"] = {"role": "assistant", "content": ""} if chat else ""
            if c["logprobs"]:
                c["logprobs"] = {k: v[:at + 1] for k, v in c["logprobs"].items()}
            saved += per - (at + 1)
    return saved


MARKER = 3
"""The token id of ``<unk>``, the marker a cut trace ends on."""
THOUGHT_TOKENS = 6
"""Tokens of a fake thought (``reasoning_field``; a prompt with ``think=K``: ``K``)."""
PROBE_TOKENS = 5
"""Tokens of a fake probe's answer."""


def thought_of(truth: int, *, cut: bool = False, length: int = THOUGHT_TOKENS) -> str:
    """A fake thought of ``length`` words (at least six), one of them a wrong number (answers come from
    the content only); ``cut``: stopped inside the thought (its last words missing)."""
    words = ["Let", "me", "think:", "maybe", f"{truth + 3}?", *["hmm"] * max(0, length - 6), "No."]
    return " ".join(words[:3] if cut else words)


_PROSE = ("because the value follows from adding each part of the question carefully and then checking "
          "that nothing was left out of the sum so we can be sure")
_WORDS = tuple(_PROSE.split(" "))
STYLES = ("number", "math", "code", "prose")


def styled(style: str, answer: int) -> str:
    """A choice's text for ``answer`` in one of :data:`STYLES`."""
    if style == "math":
        return f"Simplifying gives \\boxed{{\\frac{{x}}{{{answer}}}}}."
    if style == "code":
        return f"The answer is `solve = lambda xs: sorted(xs, key=lambda v: (v % {answer}, -v))[:{answer}]`."
    if style == "prose":
        rng = random.Random(answer)
        return "Final answer: " + " ".join(rng.choice(_WORDS) for _ in range(30)) + f" {answer}."
    return f"Let me work it out. The answer is {answer}."


def _alternatives(lp: float, top: int) -> list[float]:
    """``top`` alternatives of a token of log-prob ``lp``: far below it when the model is sure (a right
    answer, ``lp`` -0.01), close behind when it is not."""
    start, gap = (-5.0, 1.0) if lp > -0.1 else (-1.5, 0.5)
    return [lp] + [start - gap * j for j in range(top - 1)] if top else []


def _logprobs(lp: float, tokens: int, chat: bool, top: int = 0) -> dict[str, Any]:
    """The ``logprobs`` of one choice of ``tokens`` tokens, each with log-prob ``lp`` (and ``top``
    alternatives when asked)."""
    alts = _alternatives(lp, top)
    if chat:
        entry = {"token": "t", "logprob": lp, "top_logprobs": [{"token": f"t{j}", "logprob": v} for j, v in
                                                               enumerate(alts)]}
        return {"content": [entry] * tokens}
    out: dict[str, Any] = {"tokens": ["t"] * tokens, "token_logprobs": [lp] * tokens}
    if alts:
        out["top_logprobs"] = [{f"t{j}": v for j, v in enumerate(alts)}] * tokens
    return out


def serve_fake(port: int, latency_s: float, host: str = "127.0.0.1", p_correct: float = 0.7,
               style: str = "number", token_latency_s: float = 0.0, stall_after: int | None = None) -> None:
    """Run the fake server with uvicorn (blocking); used by benchmarks as a separate process."""
    import uvicorn

    uvicorn.run(FakeOpenAI(latency_s=latency_s, p_correct=p_correct, style=style, token_latency_s=token_latency_s,
                           stall_after=stall_after),
                host=host, port=port,
                log_level="warning", access_log=False)


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif msg["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
