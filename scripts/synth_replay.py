"""Write a synthetic replay file (the ``data/replay`` JSONL schema) with a chosen difficulty mix.

Per problem: single-sample success ``p ~ sum_k w_k Beta(a_k, b_k)`` (a mixture, default: a bimodal
easy/hard mix plus a middle bump, unlike AddSub's). A wrong sample is ``null`` with probability
``null_rate``; otherwise, with probability ``systematic`` it is the problem's one systematic wrong
answer, else one of ``distractors`` other wrong answers (uniform). A per-sample RM-like score is
``sigmoid(signal * (2 * correct - 1) + N(0, 1))``. Seeded, so the file is reproducible::

    python scripts/synth_replay.py --out var/synth.jsonl --problems 400 --samples 32 --seed 1
    python scripts/synth_replay.py --out var/letters.jsonl --problems 500 --samples 40 --answers letters
"""

from __future__ import annotations

import argparse
import json
import math
import random

MIX = ((0.35, 6.0, 1.5), (0.25, 2.0, 2.0), (0.40, 0.7, 4.0))  # (weight, a, b) of the success-rate mixture


def difficulty(rng: random.Random) -> float:
    """A problem's single-sample success rate, drawn from the Beta mixture :data:`MIX`."""
    u, acc = rng.random(), 0.0
    a, b = MIX[-1][1:]
    for w, a_k, b_k in MIX:
        acc += w
        if u <= acc:
            a, b = a_k, b_k
            break
    return rng.betavariate(a, b)


def problem(rng: random.Random, i: int, args: argparse.Namespace) -> dict[str, object]:
    p = difficulty(rng)
    if args.answers == "letters":
        question, gold, systematic, others = letters_problem(rng, args.distractors)
    else:
        question = f"synthetic problem {i}"
        gold = str(rng.randint(10, 999))
        systematic = str(int(gold) + rng.choice((-10, -1, 1, 10, 100)))
        others = [str(int(gold) + d) for d in rng.sample(range(11, 400), args.distractors)]
    answers: list[str | None] = []
    correct: list[bool] = []
    scores: list[float] = []
    for _ in range(args.samples):
        ok = rng.random() < p
        if ok:
            ans: str | None = gold
        elif rng.random() < args.null_rate:
            ans = None
        elif rng.random() < args.systematic:
            ans = systematic
        else:
            ans = rng.choice(others)
        answers.append(ans)
        correct.append(ok)
        z = args.signal * (1 if ok else -1) + rng.gauss(0.0, 1.0)
        scores.append(round(1.0 / (1.0 + math.exp(-z)), 4))
    return {"id": f"s{i}", "question": question, "gold": gold, "answers": answers,
            "correct": correct, "scores": scores, "meta": {"dataset": "synthetic", "p": round(p, 4)}}


_NAMES = ("Ada", "Alan", "Barbara", "Claude", "Donald", "Edsger", "Frances", "Grace", "Hedy", "John", "Ken", "Leslie",
          "Linus", "Margaret", "Niklaus", "Radia", "Robin", "Shafi", "Tim", "Tony", "Vint", "Whitfield", "Yukihiro",
          "Zhang")


def letters_problem(rng: random.Random, distractors: int) -> tuple[str, str, str, list[str]]:
    """Last-letter concatenation: the question, its answer, a systematic wrong answer (one letter
    changed) and ``distractors`` other wrong ones (letters dropped, swapped or changed)."""
    words = rng.sample(_NAMES, 4)
    gold = "".join(w[-1] for w in words).lower()

    def wrong() -> str:
        letters = list(gold)
        move = rng.choice(("change", "swap", "drop", "first"))
        if move == "change":
            letters[rng.randrange(len(letters))] = rng.choice("abcdefghijklmnopqrstuvwxyz")
        elif move == "swap":
            i = rng.randrange(len(letters) - 1)
            letters[i], letters[i + 1] = letters[i + 1], letters[i]
        elif move == "drop":
            del letters[rng.randrange(len(letters))]
        else:
            letters = [w[0].lower() for w in words]
        out = "".join(letters)
        return out if out != gold else out + "a"

    question = f'Take the last letters of the words in "{" ".join(words)}" and concatenate them.'
    return question, gold, wrong(), [wrong() for _ in range(distractors)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--problems", type=int, default=400)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--null-rate", type=float, default=0.05)
    ap.add_argument("--systematic", type=float, default=0.5, help="Share of wrong answers on the systematic one.")
    ap.add_argument("--distractors", type=int, default=4)
    ap.add_argument("--answers", choices=("number", "letters"), default="number",
                    help="number: integer answers; letters: last-letter concatenation (text answers like 'yajo').")
    ap.add_argument("--signal", type=float, default=1.5, help="Score separation of right vs wrong samples.")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with open(args.out, "w", encoding="utf-8") as fh:
        for i in range(args.problems):
            fh.write(json.dumps(problem(rng, i, args)) + "\n")


if __name__ == "__main__":
    main()
