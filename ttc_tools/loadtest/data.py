"""Problems for load tests: ``(id, question, gold)`` read from a problem set or a replay file.

Accepted JSONL shapes (one object per line), detected per row:

* problem sets: ``{"problem": ..., "answer": ...}`` (MATH-500, AIME24, AMC23) or
  ``{"question": ..., "answer": ...}`` (GSM8K test, where ``answer`` is already the number after
  ``####``; a full solution ending in ``#### N`` is cut to ``N``);
* replay files: ``{"id": ..., "question": ..., "gold": ...}``.

Rows without a question are an error naming the line; a missing gold answer is allowed (the request
is then not scored).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Problem:
    id: str
    question: str
    gold: str | None


def _gold(row: dict[str, object]) -> str | None:
    for key in ("gold", "answer"):
        value = row.get(key)
        if value is None:
            continue
        text = str(value)
        if "####" in text:
            text = text.rsplit("####", 1)[1]
        return text.strip()
    return None


def parse_row(row: dict[str, object], line_no: int) -> Problem:
    """One problem from one decoded JSONL row (``line_no`` is 1-based, used for ids and errors)."""
    question = row.get("question", row.get("problem"))
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"line {line_no}: no 'question' or 'problem' text")
    pid = str(row.get("id", row.get("unique_id", f"row-{line_no}")))
    return Problem(pid, question, _gold(row))


def load_problems(path: Path, *, limit: int | None = None, shuffle: bool = False,
                  seed: int = 0) -> list[Problem]:
    """Read ``path`` (JSONL); optionally shuffle with ``random.Random(seed)`` and keep ``limit``."""
    if not path.is_file():
        raise FileNotFoundError(f"problem file {path} does not exist")
    problems: list[Problem] = []
    with path.open(encoding="utf-8") as fh:
        for i, line in enumerate(fh, start=1):
            if line.strip():
                problems.append(parse_row(json.loads(line), i))
    if not problems:
        raise ValueError(f"{path} holds no problems")
    if shuffle:
        random.Random(seed).shuffle(problems)
    return problems[:limit] if limit else problems
