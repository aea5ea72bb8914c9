"""Step-level checking, labelling and corruption of worked solutions to the demo arithmetic problems.

Pure standard library (the service and the tests import it without torch). The process reward model
``models/arith-prm`` is trained on the labels this module gives, and its evaluation scores against them.

A worked solution (what ``models/arith-llama`` writes, see :mod:`ttc_tools.demo.problems`) is one step
per line::

    37 + 85 = 122
    122 - 19 = 103
    The answer is 103.

**Semantics of a step.** A problem ``a0 op1 a1 op2 a2 ...`` is the sum of signed terms ``+a0, ±a1, ±a2,
...``. The checker keeps that multiset of terms (the *state*) and lets a line combine two of them:

* ``x + y = r`` takes two positive terms ``x``, ``y`` (or two negative ones, ``-x``, ``-y``: summing
  subtracted numbers, as the grouped path does) and puts back ``r`` (resp. ``-r``);
* ``x - y = r`` takes a positive term ``x`` and a negative term ``-y`` and puts back ``x - y``.

A line is right iff it parses, its own arithmetic holds (``r == x op y``) and its operands are in the
state, i.e. it continues from what was computed before and uses the problem's numbers with their signs.
Both taught paths (left to right, and grouped; :func:`ttc_tools.demo.problems.worked_paths`) are such
sequences, and so is any other order of the same operations (which the demo model is never taught and
rarely writes). ``The answer is N.`` is right iff every term has been combined into one and it is ``N``
(so ``N`` is the gold answer). Where equal numbers make the choice of terms ambiguous, every reading is
kept and a line is right if it fits any of them.

**First-error labels** (PRM800K / Math-Shepherd style, decided here): once a step is wrong, every later
step is labelled wrong too, even when its own arithmetic holds -- a step is correct iff it and every
step before it are. So a solution's last label is its outcome (a wrong final answer is never preceded
by all-right steps), and "the first wrong step" is well defined.

The PRM reads the question, :data:`~ttc_tools.demo.problems.SEPARATOR`, then each step followed by the
step tag :data:`STEP_TAG` (the line breaks between steps are replaced by the tag, as Qwen2.5-Math-PRM
joins its ``\\n\\n``-separated steps with ``<extra_0>``): :func:`prm_text`, :func:`prm_messages`.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from ttc_tools.demo.problems import ANSWER_PREFIX, SEPARATOR, Problem, worked_paths

__all__ = [
    "CORRUPTIONS",
    "STEP_TAG",
    "VERDICTS",
    "Corrupted",
    "char_labels",
    "check_steps",
    "corrupt",
    "first_error",
    "label_steps",
    "lowest_step",
    "prm_messages",
    "prm_text",
    "split_steps",
    "verdict_counts",
]

#: The step tag after every step in the PRM's input (the same string as Qwen2.5-Math-PRM's).
STEP_TAG = "<extra_0>"

#: What :func:`check_steps` says of a step; only ``"ok"`` is a correct step.
VERDICTS = ("ok", "format", "arithmetic", "operands", "answer", "after_answer", "after_error")

#: Corruption kinds :func:`corrupt` knows.
CORRUPTIONS = (
    "result_propagate",  # a wrong result; later lines continue consistently from it
    "result_keep",  # a wrong result; later lines continue from the right value (so not from the line above)
    "operand_copy",  # a number of the question copied wrongly; the line's arithmetic holds
    "operand_other",  # a line that does not continue from the previous result (uses another number)
    "operator",  # + and - swapped in a line; the line's arithmetic holds
    "skip",  # an operation left out; the answer misses it
    "repeat",  # a line written twice
    "answer",  # every line right, the final "The answer is N." wrong
)

_LINE_RE = re.compile(r"^(\d+) ([+-]) (\d+) = (-?\d+)$")
_ANSWER_RE = re.compile(r"^" + re.escape(ANSWER_PREFIX) + r"(-?\d+)\.$")

State = tuple[int, ...]  # sorted signed terms


def split_steps(text: str) -> list[str]:
    """The steps of a worked solution: its non-empty lines, stripped, in order (nothing else is dropped;
    a line after the answer line stays a step and is labelled ``after_answer``)."""
    return [s for s in (line.strip() for line in text.splitlines()) if s]


def _initial_state(problem: Problem) -> State:
    return tuple(sorted([problem.first, *(x if op == "+" else -x for op, x in problem.ops)]))


def _take(state: State, a: int, b: int) -> State | None:
    """``state`` without one ``a`` and one ``b``, or ``None`` when it lacks them."""
    rest = list(state)
    for v in (a, b):
        if v not in rest:
            return None
        rest.remove(v)
    return tuple(rest)


def _advance(state: State, x: int, op: str, y: int) -> list[State]:
    """Every state that ``x op y`` (its result taken as ``x op y``) can lead to from ``state``."""
    out: list[State] = []
    if op == "+":
        for sign in (1, -1):
            rest = _take(state, sign * x, sign * y)
            if rest is not None:
                out.append(tuple(sorted([*rest, sign * (x + y)])))
    else:
        rest = _take(state, x, -y)
        if rest is not None:
            out.append(tuple(sorted([*rest, x - y])))
    return out


class _Checker:
    """Incremental first-error checker: :meth:`feed` one step at a time; :meth:`right_lines` lists every
    step that would be right next (what :func:`char_labels` compares prefixes with)."""

    def __init__(self, problem: Problem) -> None:
        self.states: set[State] = {_initial_state(problem)}
        self.answered = False
        self.failed = False

    def feed(self, step: str) -> str:
        """The verdict of ``step`` (see :func:`check_steps`); advances the state when it is ``ok``."""
        if self.failed:
            return "after_error"
        if self.answered:
            self.failed = True
            return "after_answer"
        verdict = self._judge(step)
        self.failed = verdict != "ok"
        return verdict

    def _judge(self, step: str) -> str:
        m = _LINE_RE.match(step)
        if m:
            x, op, y, r = int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))
            if r != (x + y if op == "+" else x - y):
                return "arithmetic"
            nxt = {s for st in self.states for s in _advance(st, x, op, y)}
            if not nxt:
                return "operands"
            self.states = nxt
            return "ok"
        a = _ANSWER_RE.match(step)
        if a:
            self.answered = True
            return "ok" if (int(a.group(1)),) in self.states else "answer"
        return "format"

    def right_lines(self) -> set[str]:
        """Every step :meth:`feed` would call ``ok`` now (empty after an error or the answer line)."""
        if self.failed or self.answered:
            return set()
        out: set[str] = set()
        for st in self.states:
            if len(st) == 1:
                out.add(f"{ANSWER_PREFIX}{st[0]}.")
                continue
            for i, a in enumerate(st):
                for j, b in enumerate(st):
                    if i == j:
                        continue
                    x, y = abs(a), abs(b)
                    for op in "+-":
                        if _advance(st, x, op, y):
                            out.add(f"{x} {op} {y} = {x + y if op == '+' else x - y}")
        return out


def check_steps(problem: Problem, steps: Sequence[str]) -> list[str]:
    """One verdict of :data:`VERDICTS` per step (first-error semantics, see the module docstring):
    ``ok``; ``format`` (neither ``x op y = r`` nor the answer line); ``arithmetic`` (``r != x op y``);
    ``operands`` (right arithmetic on numbers that are not available terms: a wrong number copied, a
    line that does not continue from what came before, a wrong operation); ``answer`` (an answer line
    before all terms are combined or with another number); ``after_answer`` (a line after a right
    answer line); ``after_error`` (any line after a wrong one)."""
    checker = _Checker(problem)
    return [checker.feed(step) for step in steps]


def char_labels(problem: Problem, steps: Sequence[str]) -> list[list[bool]]:
    """Per step, per character: can the solution written up to and including this character still be
    completed into a right one? I.e. every earlier step is right and the step so far is a prefix of a step
    that would be right here. A right step is ``True`` throughout; a wrong one turns ``False`` at the
    character where it leaves every right step (or never, when it stops early: ``"37 + 85 = 12"`` is a
    prefix of the right ``"37 + 85 = 122"``; its step label is still ``False``). Dense targets for training
    a PRM; the step labels stay :func:`label_steps`'s."""
    checker = _Checker(problem)
    out: list[list[bool]] = []
    for step in steps:
        lines = checker.right_lines()
        out.append([any(line.startswith(step[: k + 1]) for line in lines) for k in range(len(step))])
        checker.feed(step)
    return out


def label_steps(problem: Problem, steps: Sequence[str]) -> list[bool]:
    """Per step: ``True`` iff the step is correct (:func:`check_steps` says ``ok``; first-error labels)."""
    return [v == "ok" for v in check_steps(problem, steps)]


def first_error(labels: Sequence[bool]) -> int | None:
    """Index of the first wrong step, or ``None`` when every step is right."""
    return next((i for i, ok in enumerate(labels) if not ok), None)


def lowest_step(scores: Sequence[float]) -> int | None:
    """Index of the lowest step score (the first of equal ones), ``None`` for no steps: where a PRM says a
    solution went wrong. It *locates* the first error when it equals :func:`first_error` of the labels."""
    return min(range(len(scores)), key=scores.__getitem__) if scores else None


# ----------------------------------------------------------------------------------------- corruption
@dataclass(frozen=True, slots=True)
class Corrupted:
    """A corrupted solution: ``steps``, their :func:`label_steps` ``labels`` (at least one ``False``), the
    corruption ``kind`` (one of :data:`CORRUPTIONS`) and the ``line`` it was applied to."""

    steps: list[str]
    labels: list[bool]
    kind: str
    line: int


@dataclass(slots=True)
class _Line:
    """A parsed arithmetic line; ``src_x``/``src_y``: index of the earlier line whose result the operand
    is, or ``None`` for a number of the question."""

    x: int
    op: str
    y: int
    src_x: int | None
    src_y: int | None
    forced: int | None = None  # a wrong result written instead of x op y

    def value(self) -> int:
        if self.forced is not None:
            return self.forced
        return self.x + self.y if self.op == "+" else self.x - self.y

    def text(self) -> str:
        return f"{self.x} {self.op} {self.y} = {self.value()}"


def _parse_path(problem: Problem, worked: str) -> list[_Line]:
    """The arithmetic lines of a taught path with each operand's provenance (the later line wins when a
    question number and an earlier result are equal)."""
    lines: list[_Line] = []
    results: list[tuple[int, int]] = []  # (value, line index) of results not yet consumed
    for text in split_steps(worked)[:-1]:
        m = _LINE_RE.match(text)
        if m is None:  # pragma: no cover - taught paths always parse
            raise ValueError(f"not a worked line: {text!r}")
        x, op, y = int(m.group(1)), m.group(2), int(m.group(3))
        srcs: list[int | None] = []
        for v in (x, y):
            hit = next((k for k, (val, _) in enumerate(results) if val == v), None)
            srcs.append(results.pop(hit)[1] if hit is not None else None)
        lines.append(_Line(x, op, y, srcs[0], srcs[1]))
        results.append((lines[-1].value(), len(lines) - 1))
    return lines


def _recompute(lines: list[_Line], start: int) -> None:
    """Refresh operands from their source lines for every line after ``start`` (propagation)."""
    for j in range(start + 1, len(lines)):
        ln = lines[j]
        if ln.src_x is not None:
            ln.x = lines[ln.src_x].value()
        if ln.src_y is not None:
            ln.y = lines[ln.src_y].value()


def _perturb(v: int, rng: random.Random) -> int:
    """A plausible wrong number near ``v`` (a carry/borrow slip, a digit changed or swapped); never
    negative and never ``v``."""
    for _ in range(50):
        kind = rng.random()
        if kind < 0.5:
            w = v + rng.choice([-1, 1]) * rng.choice([1, 10, 10, 100])
        elif kind < 0.8:
            s = list(str(v))
            i = rng.randrange(len(s))
            s[i] = str(rng.choice([d for d in range(10) if str(d) != s[i] and (i > 0 or d > 0 or len(s) == 1)]))
            w = int("".join(s))
        else:
            s = list(str(v))
            if len(s) < 2:
                continue
            i = rng.randrange(len(s) - 1)
            s[i], s[i + 1] = s[i + 1], s[i]
            w = int("".join(s))
        if w != v and w >= 0:
            return w
    return v + 1


def _render(lines: list[_Line], answer: int | None) -> list[str]:
    final = lines[-1].value() if answer is None and lines else answer
    return [ln.text() for ln in lines] + [f"{ANSWER_PREFIX}{final}."]


class _Unfit(Exception):
    """The corruption does not apply to this solution."""


Applied = tuple[list[str], int]  # corrupted steps, the line touched


def _result_propagate(problem: Problem, lines: list[_Line], rng: random.Random) -> Applied:
    i = rng.randrange(len(lines))
    lines[i].forced = _perturb(lines[i].value(), rng)
    _recompute(lines, i)  # later lines continue consistently from the wrong value
    return _render(lines, None), i


def _result_keep(problem: Problem, lines: list[_Line], rng: random.Random) -> Applied:
    i = rng.randrange(len(lines))
    steps = _render(lines, None)
    steps[i] = f"{lines[i].x} {lines[i].op} {lines[i].y} = {_perturb(lines[i].value(), rng)}"
    return steps, i


def _operand_copy(problem: Problem, lines: list[_Line], rng: random.Random) -> Applied:
    q_operands = [(k, which) for k, ln in enumerate(lines) for which in ("x", "y")
                  if getattr(ln, "src_" + which) is None]
    k, which = rng.choice(q_operands)
    setattr(lines[k], which, _perturb(getattr(lines[k], which), rng))
    if lines[k].value() < 0:
        lines[k].op = "+"
    _recompute(lines, k)
    return _render(lines, None), k


def _operand_other(problem: Problem, lines: list[_Line], rng: random.Random) -> Applied:
    chained = [(k, which) for k, ln in enumerate(lines) for which in ("x", "y")
               if getattr(ln, "src_" + which) is not None]
    # one-line solutions: the first operand is not the question's first number
    k, which = rng.choice(chained) if chained else (0, "x")
    old = getattr(lines[k], which)
    pool = [v for v in [problem.first, *(x for _, x in problem.ops), *(ln.value() for ln in lines[:k])] if v != old]
    new = rng.choice(pool) if pool and rng.random() < 0.7 else _perturb(old, rng)
    setattr(lines[k], which, new)
    setattr(lines[k], "src_" + which, None)
    if lines[k].value() < 0:
        lines[k].x, lines[k].y = lines[k].y, lines[k].x
    _recompute(lines, k)
    return _render(lines, None), k


def _operator(problem: Problem, lines: list[_Line], rng: random.Random) -> Applied:
    i = rng.randrange(len(lines))
    ln = lines[i]
    ln.op = "-" if ln.op == "+" else "+"
    if ln.value() < 0:  # keep results non-negative: the larger number first
        ln.x, ln.y = max(ln.x, ln.y), min(ln.x, ln.y)
    _recompute(lines, i)
    return _render(lines, None), i


def _skip(problem: Problem, lines: list[_Line], rng: random.Random) -> Applied:
    if len(lines) < 2:  # nothing to leave out of a one-line solution
        raise _Unfit
    i = rng.randrange(len(lines))
    dropped = lines.pop(i)
    for ln in lines:  # the line that consumed the dropped result takes the dropped line's own input
        for which in ("x", "y"):
            src = getattr(ln, "src_" + which)
            if src == i:
                setattr(ln, "src_" + which, dropped.src_x)
                setattr(ln, which, dropped.x)
            elif src is not None and src > i:
                setattr(ln, "src_" + which, src - 1)
    _recompute(lines, -1)
    for ln in lines:
        if ln.value() < 0:
            ln.x, ln.y = ln.y, ln.x
    return _render(lines, None), min(i, len(lines))


def _repeat(problem: Problem, lines: list[_Line], rng: random.Random) -> Applied:
    i = rng.randrange(len(lines))
    steps = _render(lines, None)
    steps.insert(i + 1, steps[i])
    return steps, i + 1


def _answer(problem: Problem, lines: list[_Line], rng: random.Random) -> Applied:
    steps = _render(lines, None)
    right = lines[-1].value()
    pool = [v for v in [*(ln.value() for ln in lines[:-1]), *(x for _, x in problem.ops)] if v != right]
    wrong = rng.choice(pool) if pool and rng.random() < 0.3 else _perturb(right, rng)
    steps[-1] = f"{ANSWER_PREFIX}{wrong}."
    return steps, len(lines)


_APPLY = {
    "result_propagate": _result_propagate,
    "result_keep": _result_keep,
    "operand_copy": _operand_copy,
    "operand_other": _operand_other,
    "operator": _operator,
    "skip": _skip,
    "repeat": _repeat,
    "answer": _answer,
}
assert tuple(_APPLY) == CORRUPTIONS


def corrupt(problem: Problem, rng: random.Random, kind: str | None = None, path: int | None = None) -> Corrupted:
    """A wrong worked solution of ``problem``: a taught path (``worked_paths(problem)[path]``, random when
    ``None``) with one corruption of ``kind`` (random from :data:`CORRUPTIONS` when ``None``; ``skip``
    needs two or more operations).

    The labels are :func:`label_steps`'s (never set by hand); a draw that happens to stay right (e.g. a
    reordering that is still sound) is redrawn, so at least one label is ``False``. Deterministic in
    ``rng``'s state. Raises ``ValueError`` for an unknown ``kind`` or when 50 draws all failed.
    """
    if kind is not None and kind not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {kind!r}; known: {CORRUPTIONS}")
    paths = worked_paths(problem)
    for _ in range(50):
        k = kind or rng.choice(CORRUPTIONS)
        worked = paths[rng.randrange(len(paths))] if path is None else paths[path % len(paths)]
        try:
            steps, line = _APPLY[k](problem, _parse_path(problem, worked), rng)
        except _Unfit:
            continue
        labels = label_steps(problem, steps)
        if not all(labels):
            return Corrupted(steps, labels, k, line)
    raise ValueError(f"could not corrupt {problem.question!r} with {kind!r}")


# ---------------------------------------------------------------------------------------- PRM input
def prm_text(question: str, steps: Sequence[str], tag: str = STEP_TAG) -> str:
    """The PRM's raw input (``/pooling`` ``input``; the tokenizer adds ``<s>``): the question, the
    separator, then every step followed by ``tag``. The PRM scores each ``tag``."""
    return question + SEPARATOR + "".join(s + tag for s in steps)


def prm_messages(question: str, steps: Sequence[str], tag: str = STEP_TAG) -> list[dict[str, str]]:
    """The same input as chat messages (``/pooling`` ``messages``): the user's question and an assistant
    turn of the tagged steps; the chat template renders ``<s>`` + :func:`prm_text` + ``</s>``."""
    return [{"role": "user", "content": question}, {"role": "assistant", "content": "".join(s + tag for s in steps)}]


def verdict_counts(problem: Problem, texts: Sequence[str]) -> Counter[str]:
    """How often each verdict occurs over the steps of ``texts`` (diagnostics)."""
    c: Counter[str] = Counter()
    for t in texts:
        c.update(check_steps(problem, split_steps(t)))
    return c
