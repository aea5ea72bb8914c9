#!/usr/bin/env python
"""Evaluate the demo model by difficulty level: pass@1, majority-of-k and pass@k at temperature T.

Default backend: a real vLLM CPU server started by this script (run it with the vLLM venv)::

    nice -n 10 .venv-vllm/bin/python scripts/eval_demo_model.py --model models/arith-llama

which runs, from a scratch directory (never a folder with stdlib-like file names)::

    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_NO_USAGE_STATS=1 \\
    DO_NOT_TRACK=1 python -m vllm.entrypoints.openai.api_server --model DIR --host 127.0.0.1 \\
        --port 18431 --dtype float32 --max-model-len 256 --served-model-name arith-llama

and sends one ``/v1/chat/completions`` request per problem (``n`` = k samples, one user message
with the question; ``--api completions`` sends the raw prompt ``question + "\\nA:\\n"`` instead).
``--backend transformers`` samples with plain ``generate`` instead (slower).

Problems: ``ttc_tools.demo.problems.make_set(n_per_level, seed=1234)`` (excluded from training).
Writes ``eval_results.json`` next to the model and the table into the model card between the
``<!-- EVAL:START -->`` / ``<!-- EVAL:END -->`` markers (``--no-card`` to skip).
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ttc_tools.demo.problems import LEVELS, Problem, completion_prompt, extract_answer, make_set  # noqa: E402

MAX_MODEL_LEN = 256
VLLM_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


def prompt_tokens(question: str) -> int:
    # one token per character, plus <s>
    return 1 + len(completion_prompt(question))


def max_tokens_for(question: str, cap: int) -> int:
    return max(16, min(cap, MAX_MODEL_LEN - prompt_tokens(question) - 1))


# ---------------------------------------------------------------------------------------- vLLM
def vllm_command(python: str, model: Path, port: int, name: str) -> list[str]:
    return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
            "--max-model-len", str(MAX_MODEL_LEN), "--served-model-name", name]


def _post(url: str, payload: dict, timeout: float = 600) -> dict:
    req = urllib.request.Request(url, data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def wait_health(base: str, proc: subprocess.Popen, timeout: float) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(2)
    raise TimeoutError("vLLM server did not become healthy")


def sample_vllm(args, problems: list[Problem]) -> list[tuple[list[str], list[str]]]:
    name = "arith-llama"
    cmd = vllm_command(args.python, args.model.resolve(), args.port, name)
    env = {**os.environ, **VLLM_ENV}
    log_path = (ROOT / ".logs" / "vllm-eval.log")
    log_path.parent.mkdir(exist_ok=True)
    print("starting:", " ".join(cmd), flush=True)
    with tempfile.TemporaryDirectory(prefix="vllm-eval-") as cwd, open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        base = f"http://127.0.0.1:{args.port}"
        try:
            t0 = time.monotonic()
            wait_health(base, proc, args.start_timeout)
            print(f"server healthy after {time.monotonic() - t0:.0f}s", flush=True)

            def one(i: int) -> tuple[list[str], list[str]]:
                p = problems[i]
                common = {"model": name, "n": args.k, "temperature": args.temperature,
                          "top_p": 1.0, "max_tokens": max_tokens_for(p.question, args.max_tokens),
                          **({"seed": args.seed + i} if args.request_seed else {})}
                if args.api == "chat":
                    payload = {**common, "messages": [{"role": "user", "content": p.question}]}
                    r = _post(base + "/v1/chat/completions", payload)
                    ch = sorted(r["choices"], key=lambda c: c["index"])
                    return [c["message"]["content"] or "" for c in ch], [c["finish_reason"] for c in ch]
                payload = {**common, "prompt": completion_prompt(p.question)}
                r = _post(base + "/v1/completions", payload)
                ch = sorted(r["choices"], key=lambda c: c["index"])
                return [c["text"] for c in ch], [c["finish_reason"] for c in ch]

            t0 = time.monotonic()
            with ThreadPoolExecutor(args.concurrency) as ex:
                out = list(ex.map(one, range(len(problems))))
            print(f"{len(problems) * args.k} completions in {time.monotonic() - t0:.0f}s", flush=True)
            return out
        finally:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)


# -------------------------------------------------------------------------------- transformers
def sample_transformers(args, problems: list[Problem]) -> list[tuple[list[str], list[str]]]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(args.seed)
    tok = AutoTokenizer.from_pretrained(args.model)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    out: list[tuple[list[str], list[str]]] = []
    bs = max(1, 64 // args.k)
    for s in range(0, len(problems), bs):
        chunk = problems[s:s + bs]
        texts = [tok.apply_chat_template([{"role": "user", "content": p.question}], tokenize=False,
                                         add_generation_prompt=True) for p in chunk]
        b = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        n_new = min(max_tokens_for(p.question, args.max_tokens) for p in chunk)
        with torch.no_grad():
            g = model.generate(**b, do_sample=True, temperature=args.temperature, top_p=1.0, top_k=0,
                               num_return_sequences=args.k, max_new_tokens=n_new,
                               eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        gen = g[:, b["input_ids"].shape[1]:]
        dec = tok.batch_decode(gen, skip_special_tokens=True)
        stopped = [(row == tok.eos_token_id).any().item() for row in gen]
        for j in range(len(chunk)):
            sl = slice(j * args.k, (j + 1) * args.k)
            out.append((dec[sl], ["stop" if x else "length" for x in stopped[sl]]))
        print(f"{s + len(chunk)}/{len(problems)}", flush=True)
    return out


# ------------------------------------------------------------------------------------- scoring
def majority(answers: list[int | None]) -> int | None:
    votes = Counter(a for a in answers if a is not None)
    if not votes:
        return None
    best = max(votes.values())
    return next(a for a in answers if a is not None and votes[a] == best)  # ties: first seen


def score(problems: list[Problem], samples: list[tuple[list[str], list[str]]], k: int) -> dict:
    rows: dict[str, dict] = {}
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(problems):
        groups.setdefault(str(p.level), []).append(i)
    groups["all"] = list(range(len(problems)))
    for key, idx in groups.items():
        p1 = maj = pk = parsed = stopped = n = 0.0
        distinct_wrong = 0
        problems_with_wrong = 0
        for i in idx:
            texts, reasons = samples[i]
            ans = [extract_answer(t) for t in texts]
            gold = problems[i].gold
            correct = [a == gold for a in ans]
            p1 += sum(correct) / len(ans)
            maj += majority(ans) == gold
            pk += any(correct)
            parsed += sum(a is not None for a in ans)
            stopped += sum(r == "stop" for r in reasons)
            n += len(ans)
            wrong = {a for a in ans if a is not None and a != gold}
            if wrong:
                problems_with_wrong += 1
                distinct_wrong += len(wrong)
        m = len(idx)
        rows[key] = {
            "problems": m,
            "pass@1": p1 / m,
            f"maj@{k}": maj / m,
            f"pass@{k}": pk / m,
            "parsed": parsed / n,
            "stopped": stopped / n,
            "distinct_wrong_per_problem": distinct_wrong / max(1, problems_with_wrong),
        }
    return rows


def table(rows: dict, k: int) -> str:
    lines = [f"| level | operations | first / other digits | pass@1 | majority of {k} | pass@{k} | distinct wrong answers |",
             "|---|---|---|---|---|---|---|"]
    for key, r in rows.items():
        if key == "all":
            desc = "all", "", ""
        else:
            n_ops, f, o = LEVELS[int(key)]
            desc = key, str(n_ops), f"{f[0]}-{f[1]} / {o[0]}-{o[1]}"
        lines.append(f"| {desc[0]} | {desc[1]} | {desc[2]} | {r['pass@1']:.2f} | {r[f'maj@{k}']:.2f} | "
                     f"{r[f'pass@{k}']:.2f} | {r['distinct_wrong_per_problem']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "arith-llama")
    ap.add_argument("--backend", choices=["vllm", "transformers"], default="vllm")
    ap.add_argument("--api", choices=["chat", "completions"], default="chat")
    ap.add_argument("--n-per-level", type=int, default=100)
    ap.add_argument("--levels", type=str, default="", help="comma list; default all")
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--problem-seed", type=int, default=1234)
    ap.add_argument("--request-seed", action="store_true",
                    help="send a per-request seed (vllm-cpu 0.32 crashed here with 'CPU Generator does "
                         "not use offset' under concurrent seeded requests, so off by default)")
    ap.add_argument("--port", type=int, default=18431)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--start-timeout", type=float, default=600)
    ap.add_argument("--python", default=sys.executable, help="interpreter that has vllm")
    ap.add_argument("--no-card", action="store_true")
    args = ap.parse_args()

    levels = [int(x) for x in args.levels.split(",")] if args.levels else sorted(LEVELS)
    problems = make_set(args.n_per_level, levels, seed=args.problem_seed)
    t0 = time.monotonic()
    samples = (sample_vllm if args.backend == "vllm" else sample_transformers)(args, problems)
    rows = score(problems, samples, args.k)
    tab = table(rows, args.k)
    print(tab, flush=True)
    for key, r in rows.items():
        print(key, f"parsed={r['parsed']:.3f} stopped={r['stopped']:.3f}")

    result = {
        "backend": args.backend, "api": args.api, "temperature": args.temperature, "k": args.k,
        "n_per_level": args.n_per_level, "problem_seed": args.problem_seed, "seed": args.seed,
        "seconds": time.monotonic() - t0, "by_level": rows,
        "command": " ".join(vllm_command("python", args.model, args.port, "arith-llama"))
        if args.backend == "vllm" else "transformers generate",
    }
    (args.model / "eval_results.json").write_text(json.dumps(result, indent=2) + "\n")
    if args.no_card:
        return
    card_path = args.model / "README.md"
    card = card_path.read_text() if card_path.exists() else "<!-- EVAL:START -->\n<!-- EVAL:END -->\n"
    ok = rows["all"]
    section = (
        f"<!-- EVAL:START -->\n"
        f"Sampled at temperature {args.temperature} (top_p 1), {args.k} samples per problem, "
        f"{args.n_per_level} problems per level (`make_set(n, seed={args.problem_seed})`, excluded from "
        f"training), {'vLLM CPU server, `/v1/' + ('chat/completions' if args.api == 'chat' else 'completions') + '`' if args.backend == 'vllm' else 'transformers `generate`'}"
        f" (`scripts/eval_demo_model.py`). Majority vote over parsed `The answer is N.` lines "
        f"(ties: first seen). Distinct wrong answers: mean count of different wrong answers among a "
        f"problem's {args.k} samples, over problems with any wrong sample.\n\n"
        f"{tab}\n\n"
        f"Samples that stopped on `</s>`: {ok['stopped']:.3f}; parseable: {ok['parsed']:.3f}.\n"
        f"<!-- EVAL:END -->"
    )
    start, end = card.find("<!-- EVAL:START -->"), card.find("<!-- EVAL:END -->")
    if start >= 0 and end >= 0:
        card = card[:start] + section + card[end + len("<!-- EVAL:END -->"):]
    else:
        card += "\n## Evaluation (sampled)\n\n" + section + "\n"
    card_path.write_text(card)
    print(f"wrote {card_path}", flush=True)


if __name__ == "__main__":
    main()
