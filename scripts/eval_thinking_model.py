#!/usr/bin/env python
"""Evaluate the thinking demo model on a real vLLM CPU engine with a reasoning parser: per level pass@1,
majority of k, pass@k, thought lengths (tokens) and the fraction of samples that never close the thought;
optionally accuracy against a thinking budget (vLLM's ``thinking_token_budget``).

Default: start the engine itself (run it with the vLLM venv)::

    nice -n 5 .venv-vllm/bin/python scripts/eval_thinking_model.py --model models/arith-thinker \\
        --temperatures 1.0,0.8 --n-per-level 100 --k 16

which runs, from a scratch directory (never a folder with stdlib-like file names)::

    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=2 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \\
    python -m vllm.entrypoints.openai.api_server --model DIR --served-model-name arith-thinker \\
        --host 127.0.0.1 --port 18451 --dtype float32 --max-model-len 2048 --reasoning-parser qwen3

``--url http://host:port`` uses a running engine instead (it must have been started with a
``<think>`` reasoning parser). One ``/v1/chat/completions`` request per problem (``n`` = k, one user
message with the question); the answer is parsed from ``content`` (the final line after
``</think>``), the thought length is the length of ``reasoning`` (one token per character).

Problems: ``ttc_tools.demo.thinking.make_set(n_per_level, seed=1234)`` (excluded from training; levels
1-5 are the old model's problems). Writes ``eval_results.json`` next to the model and the tables into
the model card between ``<!-- EVAL:START -->`` / ``<!-- EVAL:END -->`` (``--no-card`` to skip).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ttc_tools.demo.problems import Problem  # noqa: E402
from ttc_tools.demo.thinking import LEVELS, completion_prompt, extract_answer, make_set  # noqa: E402

NAME = "arith-thinker"
MAX_MODEL_LEN = 2048
REASONING_PARSER = "qwen3"
VLLM_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "2",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


def engine_command(python: str, model: Path, port: int, parser: str = REASONING_PARSER) -> list[str]:
    """The vLLM command line this model needs: float32, 2048 positions, a ``<think>`` reasoning parser."""
    return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--served-model-name", NAME, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
            "--max-model-len", str(MAX_MODEL_LEN), "--reasoning-parser", parser]


def post(url: str, payload: dict, timeout: float = 1800) -> dict:
    """POST JSON, return the JSON reply (raises on HTTP errors, with the body in the message)."""
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"{url}: HTTP {e.code}: {e.read().decode(errors='replace')[:500]}") from e


def wait_health(base: str, proc: subprocess.Popen | None, timeout: float) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"vLLM server exited with {proc.returncode}")
        with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError), \
                urllib.request.urlopen(base + "/health", timeout=5) as r:
            if r.status == 200:
                return
        time.sleep(2)
    raise TimeoutError("vLLM server did not become healthy")


@contextlib.contextmanager
def engine(args: argparse.Namespace) -> Iterator[str]:
    """Yield the base URL of a healthy engine: ``--url``, or one started here and stopped on exit
    (SIGTERM to its process group, SIGKILL after 30 s)."""
    if args.url:
        wait_health(args.url, None, 30)
        yield args.url.rstrip("/")
        return
    cmd = engine_command(args.python, args.model.resolve(), args.port, args.parser)
    log_path = ROOT / ".logs" / "vllm-eval-thinker.log"
    log_path.parent.mkdir(exist_ok=True)
    print("starting:", " ".join(cmd), flush=True)
    with tempfile.TemporaryDirectory(prefix="vllm-eval-") as cwd, open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=cwd, env={**os.environ, **VLLM_ENV}, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        base = f"http://127.0.0.1:{args.port}"
        try:
            t0 = time.monotonic()
            wait_health(base, proc, args.start_timeout)
            print(f"server healthy after {time.monotonic() - t0:.0f}s", flush=True)
            yield base
        finally:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)


def max_tokens_for(question: str, cap: int) -> int:
    """``cap``, or what the context has left after the prompt (one token per character, plus ``<s>``;
    ``<think>`` is one token where the prompt text spells it in seven)."""
    prompt_tokens = 1 + len(completion_prompt(question)) - len("<think>") + 1
    return max(16, min(cap, MAX_MODEL_LEN - prompt_tokens))


def sample(base: str, problems: list[Problem], *, k: int, temperature: float, max_tokens: int,
           concurrency: int, budget: int | None = None) -> list[list[dict]]:
    """k samples per problem: ``{"answer", "thought_tokens", "closed", "finish_reason", "content"}``."""

    def one(p: Problem) -> list[dict]:
        payload = {"model": NAME, "messages": [{"role": "user", "content": p.question}], "n": k,
                   "temperature": temperature, "top_p": 1.0, "max_tokens": max_tokens_for(p.question, max_tokens)}
        if budget is not None:
            payload["thinking_token_budget"] = budget
        r = post(base + "/v1/chat/completions", payload)
        out = []
        for c in sorted(r["choices"], key=lambda c: c["index"]):
            msg = c["message"]
            thought = msg.get("reasoning") or msg.get("reasoning_content") or ""
            content = msg.get("content") or ""
            out.append({"answer": extract_answer(content), "thought_tokens": len(thought),
                        "closed": bool(content), "finish_reason": c["finish_reason"], "content": content[:80]})
        return out

    with ThreadPoolExecutor(concurrency) as ex:
        return list(ex.map(one, problems))


def majority(answers: list[int | None]) -> int | None:
    votes = Counter(a for a in answers if a is not None)
    if not votes:
        return None
    best = max(votes.values())
    return next(a for a in answers if a is not None and votes[a] == best)  # ties: first seen


def percentile(xs: list[int], q: float) -> float:
    s = sorted(xs)
    return float(s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]) if s else float("nan")


def score(problems: list[Problem], samples: list[list[dict]], k: int) -> dict[str, dict]:
    """Per level and overall: pass@1, maj@k, pass@k, thought tokens (mean, p10/p50/p90, max; over
    samples that closed the thought), unclosed fraction, samples that stopped on eos."""
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(problems):
        groups.setdefault(str(p.level), []).append(i)
    groups["all"] = list(range(len(problems)))
    rows: dict[str, dict] = {}
    for key, idx in groups.items():
        p1 = maj = pk = 0.0
        lens: list[int] = []
        n = unclosed = stopped = 0
        for i in idx:
            ss = samples[i]
            ans = [s["answer"] for s in ss]
            gold = problems[i].gold
            p1 += sum(a == gold for a in ans) / len(ans)
            maj += majority(ans) == gold
            pk += any(a == gold for a in ans)
            lens += [s["thought_tokens"] for s in ss if s["closed"]]
            unclosed += sum(not s["closed"] for s in ss)
            stopped += sum(s["finish_reason"] == "stop" for s in ss)
            n += len(ss)
        m = len(idx)
        rows[key] = {
            "problems": m, "pass@1": p1 / m, f"maj@{k}": maj / m, f"pass@{k}": pk / m,
            "thought_mean": sum(lens) / max(1, len(lens)), "thought_p10": percentile(lens, 0.1),
            "thought_p50": percentile(lens, 0.5), "thought_p90": percentile(lens, 0.9),
            "thought_max": max(lens, default=0), "unclosed": unclosed / n, "stopped": stopped / n,
        }
    return rows


def table(rows: dict[str, dict], k: int) -> str:
    lines = [f"| level | operations | pass@1 | majority of {k} | pass@{k} | thought tokens mean (p10 / p50 / p90, max) "
             "| thought never closed |", "|---|---|---|---|---|---|---|"]
    for key, r in rows.items():
        ops = "" if key == "all" else str(LEVELS[int(key)][0])
        lines.append(f"| {key} | {ops} | {r['pass@1']:.2f} | {r[f'maj@{k}']:.2f} | {r[f'pass@{k}']:.2f} | "
                     f"{r['thought_mean']:.0f} ({r['thought_p10']:.0f} / {r['thought_p50']:.0f} / "
                     f"{r['thought_p90']:.0f}, {r['thought_max']:.0f}) | {r['unclosed']:.3f} |")
    return "\n".join(lines)


def budget_table(sweep: dict[str, dict[str, dict]], levels: list[int]) -> str:
    head = "| thinking_token_budget | " + " | ".join(f"level {lv} pass@1" for lv in levels) + " | mean thought tokens |"
    lines = [head, "|" + "---|" * (len(levels) + 2)]
    for b, rows in sweep.items():
        mean_len = sum(rows[str(lv)]["thought_mean"] for lv in levels) / len(levels)
        lines.append(f"| {b} | " + " | ".join(f"{rows[str(lv)]['pass@1']:.2f}" for lv in levels)
                     + f" | {mean_len:.0f} |")
    return "\n".join(lines)


def write_card(card_path: Path, result: dict) -> None:
    """Replace the card's EVAL section with the tables of ``result``."""
    k = result["k"]
    parts = [f"Real vLLM 0.32 CPU engine (`{result['engine']}`), `/v1/chat/completions`, {k} samples per "
             f"problem (`n={k}`), top_p 1, problems per level as given per table (`thinking.make_set(n, seed="
             f"{result['problem_seed']})`, excluded from training; levels 1-5 are the arith-llama card's "
             f"problems), max_tokens {result['max_tokens']} (or what the 2048-token context leaves). The answer "
             "is parsed from `content` (the line after `</think>`); majority vote over parsed answers (ties: first "
             "seen). Thought tokens: length of `reasoning` (one token per character) over samples that closed "
             "it; never closed: `content` empty, the sample ran into max_tokens inside the thought "
             "(`scripts/eval_thinking_model.py`)."]
    for t, run in result["runs"].items():
        parts.append(f"**Temperature {t}**, {run['n_per_level']} problems per level ({run['seconds']:.0f} s for "
                     f"{run['completions']} completions, "
                     f"{run['tokens_per_s']:.0f} generated tokens/s)\n\n{table(run['by_level'], k)}")
    if result.get("budget_sweep"):
        bs = result["budget_sweep"]
        parts.append(f"**Accuracy against thinking budget** (`thinking_token_budget`, temperature {bs['temperature']}, "
                     f"{bs['n_per_level']} problems x {bs['k']} samples per level; `unbounded` = no budget)\n\n"
                     + budget_table(bs["by_budget"], bs["levels"]))
    section = "<!-- EVAL:START -->\n" + "\n\n".join(parts) + "\n<!-- EVAL:END -->"
    card = card_path.read_text() if card_path.exists() else "<!-- EVAL:START -->\n<!-- EVAL:END -->\n"
    start, end = card.find("<!-- EVAL:START -->"), card.find("<!-- EVAL:END -->")
    if start >= 0 and end >= 0:
        card = card[:start] + section + card[end + len("<!-- EVAL:END -->"):]
    else:
        card += "\n## Evaluation\n\n" + section + "\n"
    card_path.write_text(card)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "arith-thinker")
    ap.add_argument("--url", default="", help="a running engine (default: start one)")
    ap.add_argument("--parser", default=REASONING_PARSER, help="--reasoning-parser of a started engine")
    ap.add_argument("--n-per-level", type=int, default=100)
    ap.add_argument("--levels", default="", help="comma list; default all")
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--temperatures", default="1.0", help="comma list")
    ap.add_argument("--max-tokens", type=int, default=1900)
    ap.add_argument("--problem-seed", type=int, default=1234)
    ap.add_argument("--budgets", default="", help="comma list of thinking_token_budget values for a sweep")
    ap.add_argument("--budget-levels", default="2,4,6,8")
    ap.add_argument("--budget-n", type=int, default=30, help="problems per level in the budget sweep")
    ap.add_argument("--budget-k", type=int, default=4)
    ap.add_argument("--port", type=int, default=18451)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--start-timeout", type=float, default=600)
    ap.add_argument("--python", default=sys.executable, help="interpreter that has vllm")
    ap.add_argument("--out", type=Path, default=None, help="results JSON (default: MODEL/eval_results.json)")
    ap.add_argument("--no-card", action="store_true")
    ap.add_argument("--merge", action="store_true",
                    help="add these runs (and sweep) to the existing results JSON instead of replacing it")
    args = ap.parse_args()

    levels = [int(x) for x in args.levels.split(",")] if args.levels else sorted(LEVELS)
    problems = make_set(args.n_per_level, levels, seed=args.problem_seed)
    result: dict = {"k": args.k, "n_per_level": args.n_per_level, "problem_seed": args.problem_seed,
                    "max_tokens": args.max_tokens, "levels": levels, "runs": {},
                    "engine": " ".join(engine_command("python", args.model, args.port, args.parser)[1:])}
    out = args.out or args.model / "eval_results.json"
    if args.merge and out.exists():
        old = json.loads(out.read_text())
        if (old.get("k"), old.get("problem_seed")) == (args.k, args.problem_seed):
            result["runs"] = old.get("runs", {})
            if "budget_sweep" in old:
                result["budget_sweep"] = old["budget_sweep"]
    t_all = time.monotonic()
    with engine(args) as base:
        for t in [float(x) for x in args.temperatures.split(",")]:
            t0 = time.monotonic()
            samples = sample(base, problems, k=args.k, temperature=t, max_tokens=args.max_tokens,
                             concurrency=args.concurrency)
            secs = time.monotonic() - t0
            rows = score(problems, samples, args.k)
            n_tok = sum(s["thought_tokens"] + len(s["content"]) + 2 for ss in samples for s in ss)
            result["runs"][str(t)] = {"temperature": t, "n_per_level": args.n_per_level, "seconds": secs,
                                      "completions": len(problems) * args.k,
                                      "tokens_per_s": n_tok / secs, "by_level": rows}
            print(f"temperature {t}: {len(problems) * args.k} completions in {secs:.0f}s", flush=True)
            print(table(rows, args.k), flush=True)
        if args.budgets:
            b_levels = [int(x) for x in args.budget_levels.split(",")]
            b_problems = make_set(args.budget_n, b_levels, seed=args.problem_seed)
            t = float(args.temperatures.split(",")[0])
            sweep: dict[str, dict] = {}
            for b in args.budgets.split(","):
                budget = None if b == "unbounded" else int(b)
                ss = sample(base, b_problems, k=args.budget_k, temperature=t, max_tokens=args.max_tokens,
                            concurrency=args.concurrency, budget=budget)
                sweep[b] = score(b_problems, ss, args.budget_k)
                print(f"budget {b}: " + ", ".join(f"L{lv} {sweep[b][str(lv)]['pass@1']:.2f}" for lv in b_levels),
                      flush=True)
            result["budget_sweep"] = {"temperature": t, "levels": b_levels, "n_per_level": args.budget_n,
                                      "k": args.budget_k, "by_budget": sweep}
    result["seconds"] = time.monotonic() - t_all
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}", flush=True)
    if not args.no_card:
        write_card(args.model / "README.md", result)
        print(f"wrote {args.model / 'README.md'}", flush=True)


if __name__ == "__main__":
    main()
