"""From a model's sample to the program we run.

:func:`extract_code` finds the program in a chat answer; :func:`form_program` decides, per sample,
whether it is a chat answer (a whole program, usually fenced) or a completion that continues the
problem's prompt (HumanEval style: the program is ``prompt + sample``).

Bounds: texts longer than :data:`MAX_TEXT_CHARS` (64 KiB) are not programs we run, and nothing
longer is handed to ``ast.parse``; both functions return None for them.
"""

from __future__ import annotations

import ast
import re
import warnings
from typing import Literal

MAX_TEXT_CHARS = 64 * 1024
PYTHON_LANGS = frozenset({"", "python", "py", "python3", "py3"})

_OPEN = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([^\s`]*)[^\n`]*$")
_DEF = r"^(?:async[ \t]+)?def[ \t]+{name}[ \t]*\("
_PROMPT_DEFS = re.compile(r"^(?:async[ \t]+)?def[ \t]+([A-Za-z_]\w*)[ \t]*\(", re.M)


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, body)`` of every fenced block (``` or ~~~, any indentation), in order.

    The language is the first word of the info string, lower-cased. A fence left open at the end
    of the text (a sample cut by ``max_tokens`` or by a ``` stop sequence) runs to the end.
    """
    blocks: list[tuple[str, str]] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = _OPEN.match(lines[i])
        if m is None:
            i += 1
            continue
        fence, lang = m.group(1), m.group(2).lower()
        close = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        j = i + 1
        while j < len(lines) and close.match(lines[j]) is None:
            j += 1
        blocks.append((lang, "\n".join(lines[i + 1 : j])))
        i = j + 1
    return blocks


def parses(source: str) -> bool:
    """Whether ``source`` (at most :data:`MAX_TEXT_CHARS`) is syntactically valid Python."""
    if len(source) > MAX_TEXT_CHARS:
        return False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escape sequences in model text
            ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    return True


def extract_code(text: str) -> str | None:
    """The program in ``text``: the last fenced block tagged python/py/python3/py3 or untagged;
    else the whole text when it parses as Python; else None (also for texts over 64 KiB).

    A fenced block is returned as written, without checking that it parses (a broken program is
    the candidate's loss, not an extraction failure).
    """
    if len(text) > MAX_TEXT_CHARS:
        return None
    blocks = [body for lang, body in fenced_blocks(text) if lang in PYTHON_LANGS]
    if blocks:
        return blocks[-1] if blocks[-1].strip() else None
    if text.strip() and parses(text):
        return text
    return None


def entry_points(prompt: str) -> list[str]:
    """Names of the functions defined at column 0 of ``prompt`` (the last one is HumanEval's entry point)."""
    return _PROMPT_DEFS.findall(prompt)


def defines(text: str, name: str) -> bool:
    """Whether ``text`` defines ``name`` at top level (a ``def name(`` at column 0)."""
    return re.search(_DEF.format(name=re.escape(name)), text, re.M) is not None


def form_program(
    sample_text: str,
    *,
    prompt: str | None,
    mode: Literal["auto", "completion", "chat"],
    entry_point: str | None = None,
) -> str | None:
    """The program to run for one sample, or None when there is none.

    * ``completion``: ``prompt + sample_text`` (HumanEval records hold completions of the prompt);
      without a prompt, the sample alone.
    * ``chat``: :func:`extract_code` of the sample (a whole program, usually in a code fence),
      after the prompt when one is given and parses on its own: helpers the prompt defines (which
      tests may call, e.g. HumanEval/32's ``poly``) then exist even when the answer omits them, and
      the answer's own definitions replace the prompt's stubs.
    * ``auto``: chat when the sample contains a code fence or defines the entry point itself (at
      column 0; ``entry_point``, else the last function the prompt defines), or when there is no
      prompt; otherwise completion.

    None when the result would be over 64 KiB or no program can be extracted.
    """
    if mode == "auto":
        names = [entry_point] if entry_point else entry_points(prompt or "")[-1:]
        fenced = any(_OPEN.match(line) for line in sample_text.split("\n"))
        chat = prompt is None or fenced or any(defines(sample_text, n) for n in names)
        mode = "chat" if chat else "completion"
    if mode == "chat":
        code = extract_code(sample_text)
        if code is None or prompt is None or not parses(prompt):
            return code
        program = prompt + "\n\n" + code
        return program if len(program) <= MAX_TEXT_CHARS else None
    program = (prompt or "") + sample_text
    return program if len(program) <= MAX_TEXT_CHARS and program.strip() else None
