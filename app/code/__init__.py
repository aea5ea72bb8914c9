"""Executing candidate programs: extraction, unit-test harness, behaviour probes, a cached runner.

The programs run in :class:`app.sandbox.Sandbox`; nothing here executes model output on the host.
"""

from __future__ import annotations

from app.code.behaviour import build_behaviour_script, doctest_calls
from app.code.extract import extract_code, form_program
from app.code.harness import CodeTests, build_test_script
from app.code.runner import CodeRunner, TestOutcome

__all__ = [
    "CodeRunner",
    "CodeTests",
    "TestOutcome",
    "build_behaviour_script",
    "build_test_script",
    "doctest_calls",
    "extract_code",
    "form_program",
]
