"""Deliberately slow functions for the answer worker pool's tests (importable by spawned workers).

``HOLD_DIR`` names a folder; :func:`held_math_key` writes its pid to ``started`` there, then waits
until a file ``release`` appears before it answers like :func:`app.answers.mathparse.math_key`. Its
directory comes from the environment, which spawned workers inherit.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

from app.answers.mathparse import math_key


def held_math_key(raw: str, known: Sequence[tuple[str, str]], max_compare: int) -> str:
    hold = Path(os.environ["TTC_TEST_HOLD_DIR"])
    tmp = hold / f"starting-{os.getpid()}"
    tmp.write_text(str(os.getpid()))
    tmp.rename(hold / f"started-{os.getpid()}")  # whoever sees the file sees its content
    while not (hold / "release").exists():
        time.sleep(0.01)
    return math_key(raw, known, max_compare)


def spin(seconds: float) -> float:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
    return seconds


def pid() -> int:
    return os.getpid()
