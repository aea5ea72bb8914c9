"""Graded multi-step integer arithmetic problems with gold answers and worked solutions.

Pure standard library: the service and the tests import this without torch.

A problem is a chain of ``+``/``-`` operations on non-negative integers, posed either in symbols
("What is 37 + 85 - 19?") or in words ("Start with 37, add 85, then subtract 19. What is the
result?"). The worked solution is one line per operation and a fixed final line::

    37 + 85 = 122
    122 - 19 = 103
    The answer is 103.

Multi-step problems have two taught solution paths (left to right, or grouped: additions first,
subtracted numbers summed, one subtraction; :func:`worked_paths`), so sampled answers take
different routes and their errors differ.

Difficulty is graded by :data:`LEVELS` (number of operations, digits of the first operand, digits
of the other operands). Every step independently aims for a carry/borrow or not with probability
1/2, so carry cases are evenly covered at every level. Intermediate results never go negative.

Sequence format (what the demo model ``models/arith-llama`` was trained on)::

    <s>{question}\\nA:\\n{worked}</s>

* chat: one user message whose content is the question; the model's chat template renders
  ``<s>{question}\\nA:\\n`` for ``[user] + add_generation_prompt`` (exactly the training prefix),
  and the assistant reply is ``{worked}`` ending with ``The answer is N.``, then ``</s>`` (eos).
* raw completion: prompt = ``question + SEPARATOR`` (i.e. ``"{question}\\nA:\\n"``); the tokenizer
  prepends ``<s>`` itself (``add_special_tokens=True``, the vLLM completions default).
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "BOS",
    "EOS",
    "LEVELS",
    "SEPARATOR",
    "LevelSpec",
    "Problem",
    "chat_messages",
    "completion_prompt",
    "extract_answer",
    "generate",
    "is_correct",
    "make_set",
    "render_training_text",
    "worked_paths",
]

BOS = "<s>"
EOS = "</s>"
#: Separator between the question and the worked answer (raw-completion prompts end with it).
SEPARATOR = "\nA:\n"
ANSWER_PREFIX = "The answer is "

#: level -> (number of operations, (min, max) digits of the first operand,
#: (min, max) digits of every other operand)
#: one level: (number of operations, (min, max) digits of the first operand, (min, max) digits of the others)
LevelSpec = tuple[int, tuple[int, int], tuple[int, int]]

LEVELS: dict[int, LevelSpec] = {
    1: (1, (3, 3), (2, 2)),
    2: (2, (3, 3), (2, 2)),
    3: (3, (3, 3), (2, 2)),
    4: (4, (3, 3), (2, 2)),
    5: (5, (3, 3), (2, 2)),
}

_ANSWER_RE = re.compile(r"The answer is (-?\d+)\.")


@dataclass(frozen=True, slots=True)
class Problem:
    """One problem: ``first`` then ``ops`` (``("+" | "-", operand)`` in order), ``gold`` their result."""

    question: str
    gold: int
    level: int
    first: int
    ops: tuple[tuple[str, int], ...]

    @property
    def worked(self) -> str:
        """The left-to-right worked solution (:func:`worked_paths` lists every taught path)."""
        return "\n".join([*_left_to_right(self.first, self.ops), f"{ANSWER_PREFIX}{self.gold}."])

    @property
    def prompt(self) -> str:
        """Raw-completion prompt (without the ``<s>`` the tokenizer adds)."""
        return completion_prompt(self.question)


def _rand_digits(rng: random.Random, digits: int) -> int:
    lo = 1 if digits == 1 else 10 ** (digits - 1)
    return rng.randint(lo, 10**digits - 1)


def _has_carry(a: int, b: int, op: str) -> bool:
    """True when ``a op b`` carries (``+``) or borrows (``-``) in any column."""
    while a or b:
        da, db = a % 10, b % 10
        if op == "+" and da + db >= 10:
            return True
        if op == "-" and da < db:
            return True
        a //= 10
        b //= 10
    return False


def _pick_operand(rng: random.Random, cur: int, op: str, digits: int, want_carry: bool) -> int:
    hi = 10**digits - 1
    if op == "-":
        hi = min(hi, cur)
    lo = 1 if digits == 1 else 10 ** (digits - 1)
    x = rng.randint(lo, hi)
    for _ in range(40):
        if _has_carry(cur, x, op) == want_carry:
            return x
        x = rng.randint(lo, hi)
    return x


def _sym(op: str) -> str:
    return op


def _words(first: int, ops: Sequence[tuple[str, int]], rng: random.Random) -> str:
    verbs = [("add " if op == "+" else "subtract ") + str(x) for op, x in ops]
    body = verbs[0] if len(verbs) == 1 else ", ".join(verbs[:-1]) + ", then " + verbs[-1]
    return f"Start with {first}, {body}. What is the result?"


def _symbols(first: int, ops: Sequence[tuple[str, int]], rng: random.Random) -> str:
    expr = str(first) + "".join(f" {op} {x}" for op, x in ops)
    if rng.random() < 0.75:
        return f"What is {expr}?"
    return f"Compute {expr}."


def generate(level: int, rng: random.Random, *, levels: Mapping[int, LevelSpec] | None = None) -> Problem:
    """One problem of ``level`` (a key of ``levels``, by default :data:`LEVELS`), drawn with ``rng``.

    ``levels`` lets another task reuse this generator with its own level table (the thinking demo's
    :data:`ttc_tools.demo.thinking.LEVELS`); the draws for a given level spec are the same either way.
    """
    table = LEVELS if levels is None else levels
    if level not in table:
        raise ValueError(f"unknown level {level}; known: {sorted(table)}")
    n_ops, (f_lo, f_hi), (o_lo, o_hi) = table[level]
    cur = _rand_digits(rng, rng.randint(f_lo, f_hi))
    first = cur
    ops: list[tuple[str, int]] = []
    for _ in range(n_ops):
        digits = rng.randint(o_lo, o_hi)
        lo = 1 if digits == 1 else 10 ** (digits - 1)
        op = "+" if rng.random() < 0.5 or cur < lo else "-"
        x = _pick_operand(rng, cur, op, digits, want_carry=rng.random() < 0.5)
        ops.append((op, x))
        cur = cur + x if op == "+" else cur - x
    question = _words(first, ops, rng) if rng.random() < 0.4 else _symbols(first, ops, rng)
    return Problem(question=question, gold=cur, level=level, first=first, ops=tuple(ops))


def _left_to_right(first: int, ops: Sequence[tuple[str, int]]) -> list[str]:
    """One line per operation in the order asked: ``a op b = r``."""
    lines: list[str] = []
    total = first
    for op, x in ops:
        nxt = total + x if op == "+" else total - x
        lines.append(f"{total} {op} {x} = {nxt}")
        total = nxt
    return lines


def _grouped(first: int, ops: Sequence[tuple[str, int]]) -> list[str]:
    """The grouped path: the first operand plus every added number, then the subtracted numbers summed,
    then one subtraction (every intermediate result is at least the final one, so never negative)."""
    lines: list[str] = []
    total = first
    for op, x in ops:
        if op == "+":
            lines.append(f"{total} + {x} = {total + x}")
            total += x
    subs = [x for op, x in ops if op == "-"]
    if subs:
        taken = subs[0]
        for x in subs[1:]:
            lines.append(f"{taken} + {x} = {taken + x}")
            taken += x
        lines.append(f"{total} - {taken} = {total - taken}")
        total -= taken
    return lines


def worked_paths(problem: Problem) -> list[str]:
    """Every worked solution the demo model is taught for ``problem`` (training picks one at random),
    all with the same number of lines and the same final line:

    * left to right (``problem.worked``): ``a - b = r1``, ``r1 + c = r2``, ...;
    * grouped: add the added numbers to the first, sum the subtracted ones, subtract once
      (``a + c = s``, ``s - b = r``; for ``a - b - c``: ``b + c = t``, ``a - t = r``).

    Two paths whose lines differ give the sampled model two routes to an answer with different
    intermediate results, so its mistakes on one route are not the mistakes on the other -- the
    diversity of reasoning paths that makes a majority vote over samples beat one sample. Problems
    whose two routes coincide (one operation; ``a + b - c``; only additions) have one path.
    """
    final = f"{ANSWER_PREFIX}{problem.gold}."
    grouped = "\n".join([*_grouped(problem.first, problem.ops), final])
    return [problem.worked] if grouped == problem.worked else [problem.worked, grouped]


def make_set(
    n_per_level: int,
    levels: Iterable[int] | None = None,
    seed: int = 0,
    *,
    table: Mapping[int, LevelSpec] | None = None,
) -> list[Problem]:
    """``n_per_level`` problems for each level (all levels of ``table`` by default), deterministic in
    ``seed``. ``table`` is the level table (default :data:`LEVELS`); a level with the same spec in two
    tables yields the same problems for the same seed.

    Problems are unique within a level.
    """
    spec = LEVELS if table is None else table
    out: list[Problem] = []
    for level in sorted(spec) if levels is None else levels:
        rng = random.Random(f"arith-{seed}-{level}")
        seen: set[str] = set()
        tries = 0
        while len(seen) < n_per_level:
            p = generate(level, rng, levels=spec)
            tries += 1
            if p.question in seen:
                if tries > 100 * n_per_level:
                    raise ValueError(f"level {level} cannot supply {n_per_level} unique problems")
                continue
            seen.add(p.question)
            out.append(p)
    return out


def completion_prompt(question: str) -> str:
    """Raw-completion prompt for ``question`` (the tokenizer adds ``<s>``)."""
    return question + SEPARATOR


def chat_messages(question: str) -> list[dict[str, str]]:
    """The chat request the service sends: one user message holding the question."""
    return [{"role": "user", "content": question}]


def render_training_text(problem: Problem, *, specials: bool = True) -> str:
    """The full training sequence; the chat template renders exactly this for
    ``[user(question), assistant(worked)]``."""
    body = problem.question + SEPARATOR + problem.worked
    return f"{BOS}{body}{EOS}" if specials else body


def extract_answer(text: str) -> int | None:
    """The N of the first ``The answer is N.`` line, or ``None``."""
    m = _ANSWER_RE.search(text)
    return int(m.group(1)) if m else None


def is_correct(problem: Problem, text: str) -> bool:
    return extract_answer(text) == problem.gold
