#!/usr/bin/env python
"""Evaluate arith-prm through a real vLLM pooling server: step accuracy / ROC AUC and best-of-k reranking.

Run with the vLLM venv after ``scripts/sample_demo_solutions.py --set eval`` (the generator's 16 samples of
each held-out problem, ``make_set(100, seed=1234)``)::

    .venv-vllm/bin/python scripts/eval_prm.py --model models/arith-prm --samples .cache/demo-prm/eval.jsonl

It starts the PRM exactly as an operator would (from a scratch directory, offline environment)::

    python -m vllm.entrypoints.openai.api_server --model models/arith-prm --served-model-name arith-prm \\
        --host 127.0.0.1 --port 18473 --dtype float32 --max-model-len 256 \\
        --runner pooling --pooler-config '{"step_tag_id": 100}'

and scores every solution with ``POST /pooling`` ``{"model": "arith-prm", "input": [text, ...]}`` (``text`` =
:func:`ttc_tools.demo.steps.prm_text`; one request per ``--batch`` solutions); each answer item's ``data`` is
one ``[P(wrong), P(right)]`` pair per step tag. Nothing is scored in torch except the parity check
(``--parity N``: the first N own samples scored by the torch module too, max abs difference reported).

Held-out sets (no question of either is used in training):

* synthetic: per held-out problem one taught path and 3 corruptions (kinds in rotation), labels by
  :func:`ttc_tools.demo.steps.label_steps` (first-error);
* own: the generator's 16 samples per held-out problem, labelled by the same checker.

Reports step accuracy (P(right) >= 0.5), ROC AUC, the recall of wrong and right steps, per corruption kind
the share of corrupted solutions caught (some step < 0.5) and whose first error is located exactly (the first
step < 0.5 is the first wrong step); and per level the accuracy of one sample picked from k (1, 4, 8, 16) by
the PRM (solution score = min over steps, last step, or product), a PRM-weighted vote (sum of min scores
per answer), majority vote (ties: first seen), pass@1 and pass@k. The search issue's two targets per set
(:func:`issue_targets`: the lowest-scored step is the first wrong one; AUC of the last step's score), also
for a reference checker without training, the generator's own likelihood (:func:`generator_surprise`, in
torch; ``--no-surprise`` skips it). Writes ``eval_results.json`` next to the
model and the tables into its ``README.md`` between ``<!-- EVAL:START -->`` / ``<!-- EVAL:END -->``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from sample_demo_solutions import VllmServer, problem_from_json, read_records  # noqa: E402

from ttc_tools.demo.problems import LEVELS, Problem, extract_answer, make_set, worked_paths  # noqa: E402
from ttc_tools.demo.steps import (  # noqa: E402
    CORRUPTIONS,
    STEP_TAG,
    check_steps,
    corrupt,
    first_error,
    label_steps,
    lowest_step,
    prm_messages,
    prm_text,
    split_steps,
)

MAX_MODEL_LEN = 256
KS = (1, 4, 8, 16)
AGGREGATES = ("min", "last", "prod")


def tag_id(model: Path) -> int:
    """The id of the step tag in the model's ``tokenizer.json``."""
    tj = json.loads((model / "tokenizer.json").read_text())
    return next(t["id"] for t in tj["added_tokens"] if t["content"] == STEP_TAG)


def n_tokens(text: str) -> int:
    """Tokens of a PRM input: ``<s>`` + one per character, one per step tag."""
    return 1 + len(text) - text.count(STEP_TAG) * (len(STEP_TAG) - 1)


def auc(scores: list[float], labels: list[bool]) -> float:
    """ROC AUC (ties count half); NaN unless both classes occur."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = sorted(s for s, y in zip(scores, labels, strict=True) if not y)
    if not pos or not neg:
        return float("nan")
    import bisect

    wins = sum(bisect.bisect_left(neg, s) + 0.5 * (bisect.bisect_right(neg, s) - bisect.bisect_left(neg, s))
               for s in pos)
    return wins / (len(pos) * len(neg))


def step_metrics(scores: list[float], labels: list[bool]) -> dict[str, float]:
    right = [s for s, y in zip(scores, labels, strict=True) if y]
    wrong = [s for s, y in zip(scores, labels, strict=True) if not y]
    return {
        "steps": len(labels), "wrong_share": len(wrong) / max(1, len(labels)),
        "acc": sum((s >= 0.5) == y for s, y in zip(scores, labels, strict=True)) / max(1, len(labels)),
        "auc": auc(scores, labels),
        "recall_right": sum(s >= 0.5 for s in right) / max(1, len(right)),
        "recall_wrong": sum(s < 0.5 for s in wrong) / max(1, len(wrong)),
    }


def aggregate(scores: list[float], how: str) -> float:
    if not scores:
        return 0.0
    if how == "min":
        return min(scores)
    if how == "last":
        return scores[-1]
    return math.prod(scores)


def majority(answers: list[int | None]) -> int | None:
    votes = Counter(a for a in answers if a is not None)
    if not votes:
        return None
    best = max(votes.values())
    return next(a for a in answers if a is not None and votes[a] == best)


def weighted_vote(answers: list[int | None], weights: list[float]) -> int | None:
    tot: dict[int, float] = defaultdict(float)
    for a, w in zip(answers, weights, strict=True):
        if a is not None:
            tot[a] += w
    return max(tot, key=lambda a: tot[a]) if tot else None


# ------------------------------------------------------------------------------------------ scoring
def score_all(srv: VllmServer, texts: list[str], batch: int) -> tuple[list[list[float] | None], list[float]]:
    """P(right) per step of every text via ``/pooling`` (``None`` for texts over the model length), and the
    wall time of each request."""
    out: list[list[float] | None] = [None] * len(texts)
    todo = [i for i, t in enumerate(texts) if n_tokens(t) <= MAX_MODEL_LEN]
    times: list[float] = []
    for s in range(0, len(todo), batch):
        idx = todo[s:s + batch]
        t0 = time.perf_counter()
        r = srv.post("/pooling", {"model": "arith-prm", "input": [texts[i] for i in idx]})
        times.append(time.perf_counter() - t0)
        expected = sum(n_tokens(texts[i]) for i in idx)
        if r["usage"]["prompt_tokens"] != expected:  # the server must tokenize one token per character
            raise RuntimeError(f"server counted {r['usage']['prompt_tokens']} prompt tokens, expected {expected}")
        for item in r["data"]:
            out[idx[item["index"]]] = [pair[1] for pair in item["data"]]
    return out, times


def synthetic_set(problems: list[Problem], per_problem: int, seed: int) -> list[tuple[Problem, list[str], str]]:
    """One taught path (kind ``none``) and ``per_problem`` corruptions (kinds in rotation) per problem."""
    rng = random.Random(seed)
    out: list[tuple[Problem, list[str], str]] = []
    kinds = list(CORRUPTIONS)
    j = 0
    for p in problems:
        out.append((p, split_steps(rng.choice(worked_paths(p))), "none"))
        for _ in range(per_problem):
            kind = kinds[j % len(kinds)]
            j += 1
            if kind == "skip" and len(p.ops) == 1:
                kind = "answer"
            c = corrupt(p, rng, kind)
            out.append((p, c.steps, c.kind))
    return out


def rerank_table(groups: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Per level (and ``all``): pass@1 (mean over all samples), and for each k of :data:`KS` the accuracy of
    the answer picked from the first k samples by each method, and pass@k."""
    res: dict[str, dict[str, float]] = {}
    for key, recs in groups.items():
        row: dict[str, float] = {"problems": len(recs),
                                 "pass@1": sum(sum(r["correct"]) / len(r["correct"]) for r in recs) / len(recs)}
        for k in KS:
            acc: Counter[str] = Counter()
            for r in recs:
                ans, ok, sc = r["answers"][:k], r["correct"][:k], r["scores"][:k]
                acc[f"pass@{k}"] += any(ok)
                acc[f"majority@{k}"] += majority(ans) == r["gold"]
                for how in AGGREGATES:
                    agg = [aggregate(s or [], how) for s in sc]
                    acc[f"prm_{how}@{k}"] += ok[max(range(len(agg)), key=lambda i: agg[i])]
                acc[f"prm_weighted_vote@{k}"] += weighted_vote(ans, [aggregate(s or [], "min") for s in sc]) == r["gold"]
            row |= {name: v / len(recs) for name, v in acc.items() if name != "pass@1"}
        res[key] = row
    return res


def fmt(x: float) -> str:
    return "n/a" if isinstance(x, float) and math.isnan(x) else f"{x:.3f}"


def markdown(res: dict[str, Any]) -> str:
    s, o = res["step_level"]["synthetic"], res["step_level"]["own"]
    lines = [
        f"Held-out problems `make_set(100, seed=1234)` (500, levels 1-5; none used in training), scored by the "
        f"vLLM {res['vllm']} CPU pooling server (`scripts/eval_prm.py`). Step P(right) = `data[i][1]`.",
        "",
        "**Step level** (a step counts as right when P(right) >= 0.5):",
        "",
        "| set | solutions | steps | wrong steps | accuracy | ROC AUC | recall of right steps | recall of wrong steps |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, m, n in (("synthetic: taught paths + corruptions", s, res["counts"]["synthetic"]),
                       ("the generator's own samples (T=1.0)", o, res["counts"]["own"])):
        lines.append(f"| {name} | {n} | {m['steps']} | {m['wrong_share']:.2f} | {fmt(m['acc'])} | {fmt(m['auc'])} | "
                     f"{fmt(m['recall_right'])} | {fmt(m['recall_wrong'])} |")
    lines += ["", "**The search issue's targets**: among wrong solutions, the lowest-scored step is the first wrong one "
              "(target >= 0.80); ROC AUC of the last step's score against the solution being right (target >= 0.90).",
              "", "| set | wrong solutions | first wrong step = lowest step | final-step AUC |", "|---|---|---|---|"]
    rows = [("synthetic", s), ("own samples", o)]
    ref = res.get("surprise_reference")
    if ref:
        rows += [("reference, synthetic: generator surprise", ref["synthetic"]),
                 ("reference, own samples: generator surprise", ref["own"])]
    for name, m in rows:
        lines.append(f"| {name} | {m['wrong_solutions']} | {fmt(m['argmin_located'])} | {fmt(m['final_auc'])} |")
    if ref:
        lines += ["", "Reference rows: no PRM, each step scored by the generator's lowest log-probability of a "
                  "character so far (`generator_surprise`). Where the PRM's lowest score falls: first-error labels train every step after an error "
                  "towards 0 too, so the lowest is usually the last step, not the first wrong one."]
    lines += ["", "Own samples by the checker's verdict of the step (mean P(right)): "
              + ", ".join(f"`{v}` {d['mean_p_right']:.3f} ({d['steps']})" for v, d in res["own_by_verdict"].items()),
              "", "**Per corruption kind** (synthetic): caught = some step < 0.5; located = the first step < 0.5 is "
              "the first wrong step (for `none`: no step < 0.5); lowest = the lowest-scored step is the first wrong one.", "",
              "| kind | solutions | caught | located | lowest |", "|---|---|---|---|---|"]
    for kind, d in res["by_kind"].items():
        lowest = fmt(d["argmin"]) if kind != "none" else "-"
        lines.append(f"| {kind} | {d['n']} | {fmt(d['caught'])} | {fmt(d['located'])} | {lowest} |")
    lines += ["", f"Own samples: wrong solutions caught {fmt(res['own_solutions']['caught'])}, first error located "
              f"{fmt(res['own_solutions']['located'])}, right solutions passed {fmt(res['own_solutions']['passed'])}; "
              f"solution-level AUC (min step vs final answer right) {fmt(res['own_solutions']['auc_min'])}.", ""]
    lines += ["**Best of 16** (the generator's 16 samples per problem, T=1.0): accuracy of the answer picked.", "",
              "| level | pass@1 | majority | PRM min | PRM last | PRM product | PRM-weighted vote | pass@16 |",
              "|---|---|---|---|---|---|---|---|"]
    for key, r in res["rerank"].items():
        lines.append(f"| {key} | {r['pass@1']:.3f} | {r['majority@16']:.3f} | {r['prm_min@16']:.3f} | "
                     f"{r['prm_last@16']:.3f} | {r['prm_prod@16']:.3f} | {r['prm_weighted_vote@16']:.3f} | "
                     f"{r['pass@16']:.3f} |")
    a = res["rerank"]["all"]
    lines += ["", "All levels, first k samples: " + "; ".join(
        f"k={k}: majority {a[f'majority@{k}']:.3f}, PRM min {a[f'prm_min@{k}']:.3f}, pass@{k} {a[f'pass@{k}']:.3f}"
        for k in KS[1:]) + ".", ""]
    lat = res["latency"]
    lines += [f"Latency (warm server, 2 shared CPU cores): one `/pooling` request with the 16 samples of a problem "
              f"{lat['batch16_median_ms']:.0f} ms median (p90 {lat['batch16_p90_ms']:.0f} ms); the "
              f"{res['counts']['total']} solutions in requests of {res['batch']}: {lat['all_s']:.1f} s. Server start: "
              f"{lat['start_s']:.0f} s. vLLM vs torch on {res['parity']['n']} inputs: max |ΔP| "
              f"{res['parity']['max_abs_diff']:.2e}; chat `messages` vs `input`: max |ΔP| "
              f"{res['parity']['chat_vs_input_max_abs_diff']:.2e}."]
    return "\n".join(lines)


Own = tuple[Problem, list[str], str, int]  # problem, steps, raw sample text, record index
Synth = tuple[Problem, list[str], str]  # problem, steps, corruption kind ("none": a taught path)


def serve_and_score(args: argparse.Namespace, texts: list[str], own: list[Own], n_synth: int,
                    recs: list[dict[str, Any]], flags: tuple[str, ...]) -> tuple[list[list[float] | None], dict]:
    """Start the PRM's pooling server, score ``texts``, time 16-solution requests, compare chat vs input."""
    with VllmServer(args.model, "arith-prm", args.port, ROOT / ".logs" / "vllm-eval-prm.log", flags) as srv:
        srv.post("/pooling", {"model": "arith-prm", "input": texts[:4]})  # warm-up
        t0 = time.perf_counter()
        scores, _ = score_all(srv, texts, args.batch)
        all_s = time.perf_counter() - t0
        lat16: list[float] = []
        for ri in range(0, len(recs), 10):  # one request per problem: its 16 samples
            batch16 = [prm_text(problem_from_json(recs[ri]).question, split_steps(t)) for t in recs[ri]["samples"]]
            t1 = time.perf_counter()
            srv.post("/pooling", {"model": "arith-prm", "input": batch16})
            lat16.append((time.perf_counter() - t1) * 1000)
        chat_diff = 0.0
        for (p, st, _, _), sc in list(zip(own, scores[n_synth:], strict=True))[:20]:
            r = srv.post("/pooling", {"model": "arith-prm", "messages": prm_messages(p.question, st)})
            chat = [pair[1] for pair in r["data"][0]["data"]]
            chat_diff = max([chat_diff, *(abs(a - b) for a, b in zip(chat, sc or [], strict=True))])
        timing = {"batch16_median_ms": statistics.median(lat16),
                  "batch16_p90_ms": sorted(lat16)[int(0.9 * (len(lat16) - 1))], "batch16_requests": len(lat16),
                  "all_s": all_s, "start_s": srv.start_s, "chat_vs_input_max_abs_diff": chat_diff}
    return scores, timing


def torch_parity(model: Path, own: list[Own], scores: list[list[float] | None], n: int, tid: int) -> dict:
    """Max |P(vLLM) - P(torch)| over the steps of the first ``n`` own samples (saved tokenizer, torch module)."""
    import torch
    from train_prm import load_prm
    from transformers import AutoTokenizer

    m = load_prm(model)
    tok = AutoTokenizer.from_pretrained(model)
    diffs = [0.0]
    with torch.no_grad():
        for (p, st, _, _), sc in list(zip(own, scores, strict=True))[:n]:
            tp = m.step_probs(torch.tensor([tok(prm_text(p.question, st))["input_ids"]]), tid)[0]
            diffs += [abs(a - b) for a, b in zip(tp, sc or [], strict=True)]
    return {"n": n, "max_abs_diff": max(diffs)}


def generator_surprise(generator: Path, solutions: list[tuple[Problem, list[str]]],
                       batch: int = 64) -> list[list[float]]:
    """Per solution, per step: the generator's lowest log-probability of a character of the solution up to
    and including that step (``min_t log P_gen(x_t | x_<t)``, the line breaks between steps left out) -- a
    reference step checker built from the generator's own likelihood, no training, whose lowest step is
    the one with the most surprising character. Scored in torch on the same ids the PRM reads (each step
    tag read as the line break it replaces)."""
    import torch
    from train_prm import Encoder
    from transformers import AutoModelForCausalLM

    enc = Encoder(generator)
    gen = AutoModelForCausalLM.from_pretrained(generator, dtype=torch.float32).eval()
    out: list[list[float]] = []
    with torch.no_grad():
        for start in range(0, len(solutions), batch):
            chunk = [enc.example(p.question, st, [True] * len(st))[0] for p, st in solutions[start:start + batch]]
            x = torch.zeros((len(chunk), max(len(ids) for ids in chunk)), dtype=torch.long)
            for i, ids in enumerate(chunk):
                x[i, : len(ids)] = torch.tensor(ids)
            x[x == enc.tag] = enc.map["\n"]  # right padding never changes earlier positions (causal)
            lp = torch.log_softmax(gen(input_ids=x).logits, -1)[:, :-1].gather(-1, x[:, 1:, None])[..., 0]
            for i, ids in enumerate(chunk):
                tags = [t for t, tok in enumerate(ids) if tok == enc.tag]
                first = len(ids) - sum(len(st) + 1 for st in solutions[start + i][1])  # the first step's first char
                row, low = [], 0.0
                for tag in tags:  # characters first..tag-1, predicted at positions first-1..tag-2
                    low = min(low, lp[i, first - 1: tag - 1].min().item() if tag > first else 0.0)
                    row.append(low)
                    first = tag + 1
                out.append(row)
    return out


def synthetic_results(synth: list[Synth], scores: list[list[float] | None]) -> tuple[dict, dict]:
    """Step metrics and per-kind catch / locate rates on the synthetic set."""
    s_sc: list[float] = []
    s_lab: list[bool] = []
    solutions: list[tuple[list[float], list[bool], bool]] = []
    by_kind: dict[str, Counter[str]] = defaultdict(Counter)
    for (p, st, kind), sc in zip(synth, scores, strict=True):
        if sc is None:
            continue
        lab = label_steps(p, st)
        s_sc += sc
        s_lab += lab
        solutions.append((sc, lab, all(lab)))
        low = next((i for i, x in enumerate(sc) if x < 0.5), None)
        by_kind[kind]["n"] += 1
        by_kind[kind]["caught"] += low is not None
        by_kind[kind]["located"] += low == first_error(lab)
        by_kind[kind]["argmin"] += lowest_step(sc) == first_error(lab)
    kinds = {k: {"n": c["n"], "caught": c["caught"] / c["n"], "located": c["located"] / c["n"],
                 "argmin": c["argmin"] / c["n"]}
             for k, c in sorted(by_kind.items())}
    return step_metrics(s_sc, s_lab) | issue_targets(solutions), kinds


def issue_targets(solutions: list[tuple[list[float], list[bool], bool]]) -> dict[str, float]:
    """The PRM targets of the search issue over ``(step scores, step labels, solution right)``: the share of
    wrong solutions whose lowest-scored step is the first wrong one (``argmin_located``; target >= 0.8) and
    the ROC AUC of the final step's score against the solution being right (``final_auc``; >= 0.9)."""
    wrong = [(sc, lab) for sc, lab, ok in solutions if not ok and sc]
    return {
        "wrong_solutions": len(wrong),
        "argmin_located": sum(lowest_step(sc) == first_error(lab) for sc, lab in wrong) / max(1, len(wrong)),
        "final_auc": auc([sc[-1] if sc else 0.0 for sc, _, _ in solutions], [ok for _, _, ok in solutions]),
    }


def own_results(own: list[Own], scores: list[list[float] | None]) -> tuple[dict, dict, dict]:
    """Step metrics, mean P(right) per checker verdict, and solution-level catch rates on own samples."""
    o_sc: list[float] = []
    o_lab: list[bool] = []
    verdict_p: dict[str, list[float]] = defaultdict(list)
    sol: Counter[str] = Counter()
    sol_min: list[float] = []
    sol_ok: list[bool] = []
    solutions: list[tuple[list[float], list[bool], bool]] = []
    for (p, st, text, _), sc in zip(own, scores, strict=True):
        if sc is None:
            continue
        lab = label_steps(p, st)
        o_sc += sc
        o_lab += lab
        for v, x in zip(check_steps(p, st), sc, strict=True):
            verdict_p[v].append(x)
        low = next((i for i, x in enumerate(sc) if x < 0.5), None)
        right = extract_answer(text) == p.gold and all(lab)
        sol["right"] += right
        sol["wrong"] += not right
        sol["passed"] += right and low is None
        sol["caught"] += (not right) and low is not None
        sol["located"] += (not right) and low == first_error(lab)
        sol_min.append(min(sc) if sc else 0.0)
        sol_ok.append(extract_answer(text) == p.gold)
        solutions.append((sc, lab, right))
    by_verdict = {v: {"steps": len(x), "mean_p_right": statistics.fmean(x)}
                  for v, x in sorted(verdict_p.items(), key=lambda kv: -len(kv[1]))}
    sols = {"right": sol["right"], "wrong": sol["wrong"], "passed": sol["passed"] / max(1, sol["right"]),
            "caught": sol["caught"] / max(1, sol["wrong"]), "located": sol["located"] / max(1, sol["wrong"]),
            "auc_min": auc(sol_min, sol_ok)}
    return step_metrics(o_sc, o_lab) | issue_targets(solutions), by_verdict, sols


def rerank_results(own: list[Own], scores: list[list[float] | None]) -> dict[str, dict[str, float]]:
    per_rec: dict[int, dict[str, Any]] = {}
    for (p, _, text, ri), sc in zip(own, scores, strict=True):
        d = per_rec.setdefault(ri, {"gold": p.gold, "level": p.level, "answers": [], "correct": [], "scores": []})
        a = extract_answer(text)
        d["answers"].append(a)
        d["correct"].append(a == p.gold)
        d["scores"].append(sc)
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for d in per_rec.values():
        groups[str(d["level"])].append(d)
        groups["all"].append(d)
    return rerank_table(dict(sorted(groups.items(), key=lambda kv: (kv[0] == "all", kv[0]))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "arith-prm")
    ap.add_argument("--samples", type=Path, default=ROOT / ".cache" / "demo-prm" / "eval.jsonl")
    ap.add_argument("--port", type=int, default=18473)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--corruptions", type=int, default=3, help="synthetic corruptions per held-out problem")
    ap.add_argument("--parity", type=int, default=64)
    ap.add_argument("--no-card", action="store_true")
    ap.add_argument("--generator", type=Path, default=ROOT / "models" / "arith-llama",
                    help="the generator whose likelihood is the reference step checker")
    ap.add_argument("--no-surprise", dest="surprise", action="store_false",
                    help="skip the generator-likelihood reference row")
    args = ap.parse_args()

    held_out = make_set(100, seed=1234)
    recs = read_records(args.samples)
    if {r["question"] for r in recs} != {p.question for p in held_out}:
        raise SystemExit(f"{args.samples} is not the held-out set make_set(100, seed=1234)")
    synth = synthetic_set(held_out, args.corruptions, seed=2027)
    own: list[Own] = []
    for ri, r in enumerate(recs):
        p = problem_from_json(r)
        own += [(p, split_steps(t), t, ri) for t in r["samples"]]
    texts = [prm_text(p.question, st) for p, st, _ in synth] + [prm_text(p.question, st) for p, st, _, _ in own]

    tid = tag_id(args.model)
    flags = ("--runner", "pooling", "--pooler-config", json.dumps({"step_tag_id": tid}))
    import vllm

    scores, timing = serve_and_score(args, texts, own, len(synth), recs, flags)
    syn_scores, own_scores = scores[: len(synth)], scores[len(synth):]
    parity = {"n": 0, "max_abs_diff": float("nan")}
    if args.parity:
        parity = torch_parity(args.model, own, own_scores, args.parity, tid)
    parity["chat_vs_input_max_abs_diff"] = timing.pop("chat_vs_input_max_abs_diff")

    res: dict[str, Any] = {"model": args.model.name,
                           "vllm": vllm.__version__, "serve_flags": list(flags), "batch": args.batch}
    res["counts"] = {"synthetic": len(synth), "own": len(own), "total": len(texts),
                     "over_max_len": sum(s is None for s in scores)}
    syn_steps, res["by_kind"] = synthetic_results(synth, syn_scores)
    own_steps, res["own_by_verdict"], res["own_solutions"] = own_results(own, own_scores)
    res["step_level"] = {"synthetic": syn_steps, "own": own_steps}
    if args.surprise:
        ref = generator_surprise(args.generator, [(p, st) for p, st, _ in synth] + [(p, st) for p, st, _, _ in own])
        res["surprise_reference"] = {"synthetic": synthetic_results(synth, ref[: len(synth)])[0],
                                     "own": own_results(own, ref[len(synth):])[0]}
    res["rerank"] = rerank_results(own, own_scores)
    res["latency"] = timing
    res["parity"] = parity
    res["levels"] = {str(k): v for k, v in LEVELS.items()}
    (args.model / "eval_results.json").write_text(json.dumps(res, indent=2) + "\n")
    md = markdown(res)
    print(md, flush=True)
    if not args.no_card:
        from train_prm import update_card

        update_card(args.model / "README.md", "EVAL", md)
        print(f"wrote {args.model / 'README.md'}", flush=True)


if __name__ == "__main__":
    main()
