"""Thinking traces for the reasoning demo model ``models/arith-thinker``: the same +/- chains as
:mod:`ttc_tools.demo.problems`, answered with a worked, self-checked thought and one final line.

Pure standard library: the service and the tests import this without torch.

Sequence format (what the model is trained on; its chat template renders exactly this)::

    <s>{question}\\nA:\\n<think>\\n{thought}</think>{final}</s>

* ``\\nA:\\n<think>\\n`` is the generation prompt (:data:`GENERATION_PROMPT`): the prompt already opens
  the thought, so every reply is a thought; ``<think>`` and ``</think>`` are single tokens.
* ``{thought}`` is lines ending in ``\\n`` (:func:`thought_lines`); it never contains the final line's
  wording, so :func:`extract_answer` may be given the whole completion.
* ``{final}`` is exactly one line with no newline: ``The answer is N.``, or ``{"answer": N}`` when the
  question asks for JSON (:data:`JSON_CUES`) -- and, rarely, when it does not, so that ``{`` is the
  model's most likely token among those a JSON grammar allows after ``</think>``.
* With an empty thought (``<think>\\n</think>``, :data:`NO_THINK_PROMPT`) the final line is a direct
  guess; a few training examples teach it (the chat template's ``enable_thinking=false``), with
  ``</think>`` on the prompt side (no loss), so the model never learns to close a thought unstarted.
* A few training thoughts are cut at a random character and closed there (``</think>`` again without
  loss: vLLM's ``thinking_token_budget`` forces it), then the final line: after a forced ``</think>``
  the model answers at once, with whatever the cut thought got to (:attr:`Trace.segments`).

The thought, for ``684 - 80 + 57`` (one line per entry)::

    684 - 80 + 57                                   the chain still to compute
    684 - 80: 4-0=4, 8-8=0, 6-0=6, so 604           the first operation, column by column
    check 604 + 80: 4+0=4, 0+8=8, 6+0=6, so 684 ok  redone by the inverse operation, column by column
    604 + 57                                        the rest of the chain
    604 + 57: 4+7=11, 0+5+1=6, 6+0=6, so 661
    check 661 - 57: 11-7=4, 6-5-1=0, 6-0=6, so 604 ok
    661                                             nothing left: the result

Columns run from the ones up. Addition writes ``a+b=s`` (``a+b+1=s`` with a carry in; the carry out is
the tens digit of ``s``); subtraction writes ``a-b=r`` (``a-b-1=r`` with a borrow in) and, when it
borrows, the top digit with its borrowed ten (``14-7=7``), so the next column subtracts 1 more. A
missing digit is ``0``. Every piece a step needs is on the line before it, so the model copies locally.

Slips: with probability ``slip_rate`` per operation the column work has one mistake (a forgotten carry
or borrow, or a column off by one), the inverse check then disagrees, and the trace corrects it::

    684 - 80: 4-0=4, 8-8=1, 6-0=6, so 614
    check 614 + 80: 4+0=4, 1+8=9, 6+0=6, so 694, not 684
    wait, 684 - 80: 4-0=4, 8-8=0, 6-0=6, so 604
    check 604 + 80: 4+0=4, 0+8=8, 6+0=6, so 684 ok

Two routes (like the old model's ``worked_paths``): when a subtraction comes before an addition, half of
the traces first rewrite the chain with the additions first (``= 684 + 57 - 80``, every intermediate
result stays >= the final one, so never negative); sampled thoughts take either, so their errors differ.

Length grows with the number of operations: about 100 characters (= tokens) for one operation, about
900 for eight (:func:`trace_length_stats`). A thought cut short has not computed every step, so the
answer after a forced ``</think>`` is mostly a guess.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable
from dataclasses import dataclass

from ttc_tools.demo import problems
from ttc_tools.demo.problems import BOS, EOS, SEPARATOR, LevelSpec, Problem

__all__ = [
    "ANSWER_PREFIX",
    "GENERATION_PROMPT",
    "JSON_CUES",
    "LEVELS",
    "NO_THINK_PROMPT",
    "THINK_END",
    "THINK_START",
    "Trace",
    "column_add",
    "column_sub",
    "completion_prompt",
    "extract_answer",
    "final_line",
    "generate",
    "make_set",
    "make_trace",
    "split_completion",
    "thought_lines",
    "trace_length_stats",
]

THINK_START = "<think>"
THINK_END = "</think>"
#: What the chat template appends for ``add_generation_prompt``: the answer separator, and the open thought.
GENERATION_PROMPT = SEPARATOR + THINK_START + "\n"
#: The generation prompt with thinking switched off (``enable_thinking=false``): an empty, closed thought.
NO_THINK_PROMPT = GENERATION_PROMPT + THINK_END
ANSWER_PREFIX = problems.ANSWER_PREFIX

#: The thinker's levels: the old model's five (same specs, so ``make_set`` draws the same problems for
#: them), then six to eight operations.
LEVELS: dict[int, LevelSpec] = {
    **problems.LEVELS,
    6: (6, (3, 3), (2, 2)),
    7: (7, (3, 3), (2, 2)),
    8: (8, (3, 3), (2, 2)),
}

#: Phrases appended to a question (after a space or a newline) that ask for a JSON final line.
JSON_CUES: tuple[str, ...] = (
    "Answer in JSON.",
    "Reply in JSON.",
    "Respond with JSON.",
    "Give the answer as JSON.",
    "Return JSON.",
    'Answer as JSON: {"answer": <number>}.',
    "Output JSON only.",
    "Use JSON.",
)

_TEXT_RE = re.compile(r"The answer is (-?\d+)\.")
_JSON_RE = re.compile(r'\{\s*"answer"\s*:\s*(-?\d+)\s*\}')


def generate(level: int, rng: random.Random) -> Problem:
    """One problem of ``level`` (a key of :data:`LEVELS`), drawn by :func:`problems.generate`."""
    return problems.generate(level, rng, levels=LEVELS)


def make_set(n_per_level: int, levels: Iterable[int] | None = None, seed: int = 0) -> list[Problem]:
    """``n_per_level`` unique problems per level of :data:`LEVELS` (all by default), deterministic in
    ``seed``; levels 1-5 equal ``problems.make_set`` for the same seed."""
    return problems.make_set(n_per_level, levels, seed, table=LEVELS)


# ------------------------------------------------------------------------------------ columns
def _digits(n: int) -> list[int]:
    """Digits of ``n >= 0``, ones first."""
    return [int(c) for c in reversed(str(n))]


def _from_digits(ds: list[int]) -> int:
    return int("".join(str(d) for d in reversed(ds)))


def column_add(a: int, b: int, *, slip: tuple[int, str] | None = None) -> tuple[str, int]:
    """``a + b`` column by column: ``("4+7=11, 0+5+1=6, 6+0=6", 661)`` for ``604 + 57``.

    ``slip=(column, kind)`` makes one mistake in ``column`` (0 = ones): ``"carry"`` drops the carry in
    (the caller makes sure there is one), ``"digit"`` writes the column's sum one too high (or, at 19,
    one too low); later columns continue correctly from what was written, and the returned value is
    what the written columns say.
    """
    if a < 0 or b < 0:
        raise ValueError("column_add takes non-negative numbers")
    da, db = _digits(a), _digits(b)
    carry = 0
    parts: list[str] = []
    out: list[int] = []
    for i in range(max(len(da), len(db))):
        x = da[i] if i < len(da) else 0
        y = db[i] if i < len(db) else 0
        c = 0 if slip == (i, "carry") else carry
        s = x + y + c
        if slip == (i, "digit"):
            s = s + 1 if s < 19 else s - 1
        parts.append(f"{x}+{y}+1={s}" if c else f"{x}+{y}={s}")
        out.append(s % 10)
        carry = s // 10
    if carry:
        out.append(carry)
    return ", ".join(parts), _from_digits(out)


def column_sub(a: int, b: int, *, slip: tuple[int, str] | None = None) -> tuple[str, int]:
    """``a - b`` (``a >= b >= 0``) column by column: ``("14-7=7, 10-1-1=8, 6-0-1=5", 587)`` for
    ``604 - 17``. A column that borrows writes its top digit plus ten; the next one subtracts 1 more.

    ``slip=(column, kind)``: ``"carry"`` drops the borrow in, ``"digit"`` writes the column's result one
    too high (at 9: one too low). The returned value is what the written columns say (never negative:
    a slip's final borrow, if any, is dropped as a human would overlook it).
    """
    if not 0 <= b <= a:
        raise ValueError("column_sub needs a >= b >= 0")
    da, db = _digits(a), _digits(b)
    borrow = 0
    parts: list[str] = []
    out: list[int] = []
    for i in range(len(da)):
        x = da[i]
        y = db[i] if i < len(db) else 0
        bi = 0 if slip == (i, "carry") else borrow
        top, borrow = (x + 10, 1) if x < y + bi else (x, 0)
        r = top - y - bi
        if slip == (i, "digit"):
            r = r + 1 if r < 9 else r - 1
        parts.append(f"{top}-{y}-1={r}" if bi else f"{top}-{y}={r}")
        out.append(r)
    return ", ".join(parts), _from_digits(out)


def _columns(a: int, op: str, b: int, slip: tuple[int, str] | None = None) -> tuple[str, int]:
    return column_add(a, b, slip=slip) if op == "+" else column_sub(a, b, slip=slip)


def _carry_columns(a: int, op: str, b: int) -> list[int]:
    """Columns of ``a op b`` that have a carry (``+``) or borrow (``-``) coming in."""
    cols, _ = _columns(a, op, b)
    return [i for i, part in enumerate(cols.split(", ")) if part.count("+" if op == "+" else "-") == 2]


def _pick_slip(rng: random.Random, a: int, op: str, b: int) -> tuple[int, str] | None:
    """A plausible mistake for ``a op b`` whose inverse check is computable (None if there is none)."""
    n_cols = max(len(str(a)), len(str(b)))
    carries = _carry_columns(a, op, b)
    options: list[tuple[int, str]] = [(i, "carry") for i in carries] * 2 + [(i, "digit") for i in range(n_cols)]
    rng.shuffle(options)
    right = a + b if op == "+" else a - b
    for slip in options:
        _, wrong = _columns(a, op, b, slip)
        if wrong != right and (op == "-" or wrong >= b):
            return slip
    return None


# ------------------------------------------------------------------------------------- thought
def _step(total: int, op: str, x: int, slip: tuple[int, str] | None) -> list[str]:
    """The lines of one operation: column work, inverse check, and (after a slip) the correction."""
    right = total + x if op == "+" else total - x
    inv = "-" if op == "+" else "+"
    cols, got = _columns(total, op, x, slip)
    lines = [f"{total} {op} {x}: {cols}, so {got}"]
    back_cols, back = _columns(got, inv, x)
    if got == right:
        lines.append(f"check {got} {inv} {x}: {back_cols}, so {back} ok")
        return lines
    lines.append(f"check {got} {inv} {x}: {back_cols}, so {back}, not {total}")
    cols, got = _columns(total, op, x)
    back_cols, back = _columns(got, inv, x)
    lines.append(f"wait, {total} {op} {x}: {cols}, so {got}")
    lines.append(f"check {got} {inv} {x}: {back_cols}, so {back} ok")
    return lines


def _chain(first: int, ops: Iterable[tuple[str, int]]) -> str:
    return str(first) + "".join(f" {op} {x}" for op, x in ops)


def thought_lines(
    problem: Problem, rng: random.Random, *, slip_rate: float = 0.1, reorder: float = 0.5
) -> tuple[list[str], int]:
    """The thought for ``problem`` as lines (without newlines) and the number of slips in it.

    Contract: the last line is the result (``str(problem.gold)``); every operation has a column line
    and an inverse check that ends in ``ok``; a slip (probability ``slip_rate`` per operation, drawn
    with ``rng``) adds a wrong column line, a check ending ``, not T`` and a ``wait, ...`` correction.
    With probability ``reorder`` (when it changes the chain) the second line rewrites the chain with
    the additions first (``= ...``). Deterministic in ``rng``'s state.
    """
    ops = list(problem.ops)
    lines = [_chain(problem.first, ops)]
    grouped = [o for o in ops if o[0] == "+"] + [o for o in ops if o[0] == "-"]
    if grouped != ops and rng.random() < reorder:
        ops = grouped
        lines.append("= " + _chain(problem.first, ops))
    total = problem.first
    slips = 0
    for k, (op, x) in enumerate(ops):
        if k:
            lines.append(_chain(total, ops[k:]))
        slip = _pick_slip(rng, total, op, x) if rng.random() < slip_rate else None
        slips += slip is not None
        lines.extend(_step(total, op, x, slip))
        total = total + x if op == "+" else total - x
    if total != problem.gold:  # pragma: no cover - the arithmetic above is exact
        raise AssertionError(f"trace reached {total}, gold is {problem.gold}")
    lines.append(str(total))
    return lines, slips


def final_line(answer: int, *, json: bool = False) -> str:
    """The one line after ``</think>``: ``The answer is N.`` or ``{"answer": N}``."""
    return f'{{"answer": {answer}}}' if json else f"{ANSWER_PREFIX}{answer}."


@dataclass(frozen=True, slots=True)
class Trace:
    """One training example: the question as asked (JSON cue included), the thought (lines each ending
    in a newline; cut anywhere when ``think_end == "forced"``; empty when ``"prompt"``) and the final line.

    ``think_end`` says who writes ``</think>``: ``"generated"`` (the model, after a whole thought),
    ``"forced"`` (the engine, at a thinking budget: the thought was cut) or ``"prompt"`` (the chat
    template, ``enable_thinking=false``: no thought).
    """

    problem: Problem
    question: str
    thought: str
    final: str
    json: bool
    slips: int
    think_end: str = "generated"

    @property
    def completion(self) -> str:
        """What follows :data:`GENERATION_PROMPT`: ``{thought}</think>{final}``."""
        return self.thought + THINK_END + self.final

    @property
    def prompt(self) -> str:
        """Raw-completion prompt (without the ``<s>`` the tokenizer adds)."""
        return completion_prompt(self.question)

    @property
    def text(self) -> str:
        """The full training sequence, specials included."""
        return f"{BOS}{self.prompt}{self.completion}{EOS}"

    @property
    def segments(self) -> list[tuple[str, bool]]:
        """``text`` in order as ``(piece, is_target)``: the training loss covers the thought, a
        ``</think>`` the model wrote itself, the final line and ``</s>`` -- never the prompt, nor a
        ``</think>`` that the engine forced or the template wrote."""
        return [(BOS + self.prompt, False), (self.thought, True), (THINK_END, self.think_end == "generated"),
                (self.final + EOS, True)]


def make_trace(
    problem: Problem,
    rng: random.Random,
    *,
    slip_rate: float = 0.1,
    reorder: float = 0.5,
    json_cue_rate: float = 0.25,
    json_silent_rate: float = 0.05,
    no_think_rate: float = 0.0,
    cut_rate: float = 0.0,
) -> Trace:
    """A training example for ``problem``, drawn with ``rng``.

    With probability ``json_cue_rate`` the question gets a JSON cue and the final line is JSON; with
    probability ``json_silent_rate`` the final line is JSON without a cue; otherwise it is
    ``The answer is N.``. With probability ``no_think_rate`` the thought is empty (a direct answer,
    ``think_end="prompt"``); else with probability ``cut_rate`` it is cut after a uniformly drawn number
    of characters (``think_end="forced"``). The final line always carries the gold answer.
    """
    u = rng.random()
    question = problem.question
    as_json = u < json_cue_rate + json_silent_rate
    if u < json_cue_rate:
        question += rng.choice((" ", "\n")) + rng.choice(JSON_CUES)
    think_end = "generated"
    if rng.random() < no_think_rate:
        thought, slips, think_end = "", 0, "prompt"
    else:
        lines, slips = thought_lines(problem, rng, slip_rate=slip_rate, reorder=reorder)
        thought = "\n".join(lines) + "\n"
        if rng.random() < cut_rate:
            thought, think_end = thought[: rng.randrange(len(thought))], "forced"
    return Trace(problem, question, thought, final_line(problem.gold, json=as_json), as_json, slips, think_end)


def completion_prompt(question: str, *, thinking: bool = True) -> str:
    """Raw-completion prompt for ``question`` (the tokenizer adds ``<s>``; ``<think>`` and ``</think>``
    in the text are read as their single tokens). ``thinking=False`` closes the thought at once."""
    return question + (GENERATION_PROMPT if thinking else NO_THINK_PROMPT)


def split_completion(text: str) -> tuple[str | None, str]:
    """``(thought, final)`` of a completion written after the generation prompt: the text before the
    first ``</think>`` and the text after it; ``(None, text)`` when the thought never closed."""
    if THINK_END not in text:
        return None, text
    thought, _, final = text.partition(THINK_END)
    return thought, final


def extract_answer(text: str) -> int | None:
    """N of the final line in ``text`` (a chat ``content``, or a whole completion): the first
    ``The answer is N.`` or ``{"answer": N}`` after the last ``</think>`` if there is one, else in
    ``text``. A thought never contains either form, so an unclosed thought gives ``None``."""
    tail = text.rpartition(THINK_END)[2]
    hits = [m for m in (_TEXT_RE.search(tail), _JSON_RE.search(tail)) if m]
    if not hits:
        return None
    return int(min(hits, key=lambda m: m.start()).group(1))


def trace_length_stats(n: int = 200, seed: int = 0, slip_rate: float = 0.1) -> dict[int, dict[str, float]]:
    """Thought length in characters (= tokens of the thinker's tokenizer) per level: min, mean, max
    over ``n`` problems -- the design numbers the model card quotes."""
    rng = random.Random(seed)
    out: dict[int, dict[str, float]] = {}
    for level in sorted(LEVELS):
        lens = []
        for _ in range(n):
            lines, _ = thought_lines(generate(level, rng), rng, slip_rate=slip_rate)
            lens.append(sum(len(line) + 1 for line in lines))
        out[level] = {"min": min(lens), "mean": sum(lens) / n, "max": max(lens)}
    return out
