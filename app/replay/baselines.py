"""Reference curves computed directly on the recorded samples with numpy (no engine loop).

Both use the sample order the replay backend serves for a seed (:meth:`ReplaySource.order`), so a
policy and its references see the same draws, seed by seed.

* **uniform**: every problem gets ``b_p`` samples, the first ``b_p`` of its shuffled list, and the
  answer is their majority vote (canonical answer keys, null answers do not vote, ties go to the
  answer drawn first, as the ``majority`` aggregator does). A fractional mean budget ``b`` gives
  ``floor(b)`` samples to every problem and one more to ``round(b * P) - floor(b) * P`` problems
  spread evenly over the file (:func:`per_problem_budgets`).
* **oracle**: knows, for each problem, ``c_p`` = the 1-based position of its first correct sample in
  the shuffled list (``inf`` when none within the cap). With ``B = round(b * P)`` samples it solves
  problems in increasing ``c_p`` while ``sum c_p <= B``: it spends ``c_p`` on each solved problem and
  nothing elsewhere. Its accuracy equals its coverage (it selects the correct sample it stopped on).

Outcomes are ``(seeds, problems)`` matrices; :mod:`app.replay.evaluator` summarises them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from app.answers.canon import keys_inline
from app.backends.replay import Problem, ReplaySource


@dataclass(frozen=True, slots=True)
class Outcomes:
    """Per ``(seed, problem)``: samples drawn, selected answer correct, any drawn sample correct;
    for policy runs also completion tokens (cancelled ones included), latency in token steps
    (:attr:`app.engine.QueryRun.steps`) and samples a trace monitor cut (among those drawn)."""

    samples: np.ndarray
    correct: np.ndarray
    covered: np.ndarray
    tokens: np.ndarray | None = None
    steps: np.ndarray | None = None
    cut: np.ndarray | None = None


@dataclass(frozen=True, slots=True)
class Shuffled:
    """The recorded samples of every problem in each seed's draw order, as arrays.

    ``codes[s, p, j]``: canonical answer of the ``j``-th sample drawn for problem ``p`` under seed ``s``,
    numbered by first appearance in that order (0 = first answer drawn; -1 = no answer or padding);
    ``correct[s, p, j]``: its recorded correctness; ``caps[p]``: samples available to problem ``p``
    (``min(n_p, cap)``); ``width`` = the largest number of distinct answers of any problem;
    ``tokens[s, p, j]``: its recorded completion tokens (0 for padding), ``None`` when some problem of
    the file records no ``tokens``.
    """

    codes: np.ndarray
    correct: np.ndarray
    caps: np.ndarray
    width: int
    tokens: np.ndarray | None = None

    @property
    def n_seeds(self) -> int:
        return int(self.codes.shape[0])

    @property
    def n_problems(self) -> int:
        return int(self.codes.shape[1])


def answer_ids(keys: Sequence[str | None]) -> list[int]:
    """Answer ids of a problem's samples in recorded order, numbered by first appearance (-1: no answer)."""
    ids: dict[str, int] = {}
    return [-1 if key is None else ids.setdefault(key, len(ids)) for key in keys]


def shuffle(problems: Sequence[Problem], seeds: Sequence[int], cap: int | None = None,
            keys: Sequence[Sequence[str | None]] | None = None) -> Shuffled:
    """Arrange every problem's samples in the order the replay backend serves them for each seed.
    ``keys[p][i]`` is the answer key of problem ``p``'s ``i``-th recorded answer (default: the
    ``auto`` kind's inline keys, math-verify left out)."""
    n_p = len(problems)
    caps = np.array([p.n if cap is None else min(p.n, cap) for p in problems], dtype=np.int64)
    width_n = max(1, int(caps.max(initial=0)))
    codes = np.full((len(seeds), n_p, width_n), -1, dtype=np.int32)
    correct = np.zeros((len(seeds), n_p, width_n), dtype=bool)
    recorded = all(p.tokens is not None for p in problems)
    tokens = np.zeros((len(seeds), n_p, width_n), dtype=np.int64) if recorded else None
    if keys is None:
        keys = [keys_inline(None, p.question, list(p.answers))[0] for p in problems]
    ids = [answer_ids(k) for k in keys]
    width = 1
    for si, seed in enumerate(seeds):
        source = ReplaySource(problems, seed)
        for pi, p in enumerate(problems):
            order = source.order(p.id)[: caps[pi]]
            relabel: dict[int, int] = {}
            row = codes[si, pi]
            for j, i in enumerate(order):
                k = ids[pi][i]
                if k >= 0:
                    row[j] = relabel.setdefault(k, len(relabel))
                correct[si, pi, j] = p.correct[i]
                if tokens is not None and p.tokens is not None:
                    tokens[si, pi, j] = p.tokens[i]
            width = max(width, len(relabel))
    return Shuffled(codes, correct, caps, width, tokens)


def per_problem_budgets(budget: float, n_problems: int) -> np.ndarray:
    """Samples per problem for a mean budget: ``floor(b)`` each, plus one for ``round(b * P) -
    floor(b) * P`` problems at evenly spread indices ``floor(i * P / E)``."""
    base = math.floor(budget)
    total = round(budget * n_problems)
    extra = max(0, min(n_problems, total - base * n_problems))
    out = np.full(n_problems, base, dtype=np.int64)
    if extra:
        out[(np.arange(extra) * n_problems) // extra] += 1
    return out


def _majority_prefix(codes: np.ndarray, correct: np.ndarray, width: int) -> np.ndarray:
    """``(P, N)``: whether the majority vote of the first ``j + 1`` samples is correct.

    The winner maximises ``count * (N + 1) - first_position`` (most votes, then drawn first); since
    codes are numbered by first appearance, that is ``count * (N + 1) - code``. A prefix without any
    answer selects nothing (incorrect). The winner's correctness is that of its first sample.
    """
    n_p, n = codes.shape
    onehot = np.zeros((n_p, n, width), dtype=np.int32)
    valid = codes >= 0
    pi, ji = np.nonzero(valid)
    onehot[pi, ji, codes[pi, ji]] = 1
    counts = np.cumsum(onehot, axis=1)
    score = counts * (n + 1) - np.arange(width, dtype=np.int32)
    winner = np.argmax(score, axis=2)
    first = np.full((n_p, width), n - 1, dtype=np.int64)
    np.minimum.at(first, (pi, codes[pi, ji]), ji)
    code_correct = np.take_along_axis(correct, first, axis=1)
    chosen = np.take_along_axis(code_correct, winner, axis=1)
    return chosen & (counts.max(axis=2) > 0)


@dataclass(frozen=True, slots=True)
class UniformTable:
    """Uniform's per-problem outcomes at every prefix length ``1..N``: ``(S, P, N)`` arrays;
    ``spent[s, p, j]``: the tokens of the first ``j + 1`` samples (None: the file has no tokens)."""

    majority: np.ndarray
    covered: np.ndarray
    caps: np.ndarray
    spent: np.ndarray | None = None

    def at(self, budget: float) -> Outcomes:
        per = np.minimum(per_problem_budgets(budget, len(self.caps)), self.caps)
        idx = np.maximum(per - 1, 0)
        take = np.broadcast_to(idx[None, :, None], (self.majority.shape[0], len(per), 1))
        majority = np.take_along_axis(self.majority, take, axis=2)[..., 0] & (per > 0)
        covered = np.take_along_axis(self.covered, take, axis=2)[..., 0] & (per > 0)
        samples = np.broadcast_to(per.astype(np.float64), majority.shape)
        tokens = None if self.spent is None else np.take_along_axis(self.spent, take, axis=2)[..., 0] * (per > 0)
        return Outcomes(samples, majority, covered, tokens)

    def curve(self) -> tuple[np.ndarray, np.ndarray]:
        """Mean samples and accuracy of uniform at integer budgets ``0..N`` (``(0, 0)`` first)."""
        n = self.majority.shape[2]
        xs, ys = [0.0], [0.0]
        for b in range(1, n + 1):
            out = self.at(b)
            xs.append(float(out.samples.mean()))
            ys.append(float(out.correct.mean()))
        return np.array(xs), np.array(ys)


def uniform_table(sh: Shuffled) -> UniformTable:
    """Majority-vote correctness and coverage of every prefix, for every seed and problem."""
    majority = np.stack([_majority_prefix(sh.codes[s], sh.correct[s], sh.width) for s in range(sh.n_seeds)])
    covered = np.logical_or.accumulate(sh.correct, axis=2)
    spent = None if sh.tokens is None else np.cumsum(sh.tokens, axis=2)
    return UniformTable(majority, covered, sh.caps, spent)


def first_correct(sh: Shuffled) -> np.ndarray:
    """``(S, P)``: 1-based position of the first correct sample within the cap, ``inf`` if none."""
    hit = sh.correct.any(axis=2)
    pos = np.argmax(sh.correct, axis=2).astype(np.float64) + 1.0
    return np.where(hit, pos, np.inf)


def oracle(costs: np.ndarray, budget: float, spent: np.ndarray | None = None) -> Outcomes:
    """The oracle at mean budget ``budget`` given first-correct costs ``(S, P)`` (see module doc). With
    ``spent`` (:attr:`UniformTable.spent`) its tokens are those of the samples it draws: a solved problem's
    prefix up to its first correct sample, nothing for the others."""
    n_s, n_p = costs.shape
    total = round(budget * n_p)
    order = np.argsort(costs, axis=1, kind="stable")
    sorted_costs = np.take_along_axis(costs, order, axis=1)
    fits = np.cumsum(sorted_costs, axis=1) <= total
    solved = np.zeros((n_s, n_p), dtype=bool)
    np.put_along_axis(solved, order, fits, axis=1)
    samples = np.where(solved, costs, 0.0)
    tokens = None
    if spent is not None:
        last = np.where(solved, costs, 1.0).astype(np.int64) - 1
        tokens = np.where(solved, np.take_along_axis(spent, last[..., None], axis=2)[..., 0], 0)
    return Outcomes(samples, solved, solved.copy(), tokens)


def pass_at_1(sh: Shuffled) -> float:
    """Mean over problems of the share of correct samples within the cap: exact pass@1."""
    caps = np.maximum(sh.caps, 1)
    return float((sh.correct.sum(axis=2) / caps).mean())
