"""How much of the service one chat request runs (ttc_tools.pathtrace), held where it is today.

The goal for a plain chat request is <= 20 files and <= 110 functions; it is not met yet, so these
limits are a ratchet at today's counts: a change that makes a request run more of the service fails
here and has to say so by raising the number."""

from __future__ import annotations

from ttc_tools.pathtrace import CHAT, PathTrace, trace_request

# (files, functions) measured by `ttc trace-path`; lower them when the path gets shorter.
LIMITS = {"default": (34, 189), "self-consistency-8": (32, 159)}


def _check(trace: PathTrace, policy: str) -> None:
    files, functions = LIMITS[policy]
    assert trace.status == 200
    shown = "\n".join(trace.lines())
    assert trace.files <= files, f"{policy}: {trace.files} files > {files}\n{shown}"
    assert trace.functions <= functions, f"{policy}: {trace.functions} functions > {functions}\n{shown}"


async def test_a_chat_request_with_the_default_policy_runs_no_more_of_the_service_than_today() -> None:
    trace = await trace_request()
    _check(trace, "default")
    assert "app/routes/inference.py" in trace.calls and "app/serving.py" in trace.calls  # the tracer sees it


async def test_a_self_consistency_request_runs_no_more_of_the_service_than_today() -> None:
    trace = await trace_request({**CHAT, "ttc": {"policy": "self-consistency-8"}})
    _check(trace, "self-consistency-8")
    assert "allocators/fixed.py" in trace.calls


async def test_the_tracer_counts_only_what_the_traced_request_runs() -> None:
    plain = await trace_request()
    refused = await trace_request({"model": "fake-model", "messages": "not a list"})
    assert refused.status == 400
    assert 0 < refused.functions < plain.functions
    assert "app/run.py" not in refused.calls
