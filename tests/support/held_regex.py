"""A regex match that holds in its answer worker until released (importable by spawned workers).

Like :func:`tests.support.slow_work.held_math_key`: :func:`held_regex_answers` writes its pid to
``started-<pid>`` in ``$TTC_TEST_HOLD_DIR``, waits until a file ``release`` appears there, then answers like
:func:`app.answers.structured.regex_answers`. Called in the test's own process (``$TTC_TEST_LOOP_PID``:
on the service's event loop) it raises at once instead: holding there would hold the loop, and the test
that waits to release it with it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

from app.answers.structured import regex_answers


def held_regex_answers(pattern: str, ignore_case: bool, which: str, texts: Sequence[str]) -> list[str | None]:
    if str(os.getpid()) == os.environ.get("TTC_TEST_LOOP_PID"):
        raise AssertionError("the pattern was matched on the event loop, not in an answer worker")
    hold = Path(os.environ["TTC_TEST_HOLD_DIR"])
    tmp = hold / f"starting-{os.getpid()}"
    tmp.write_text(str(os.getpid()))
    tmp.rename(hold / f"started-{os.getpid()}")  # whoever sees the file sees its content
    while not (hold / "release").exists():
        time.sleep(0.01)
    return regex_answers(pattern, ignore_case, which, texts)
