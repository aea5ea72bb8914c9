"""A schema fuzzer in ``make test``: schemathesis generates requests from the service's own OpenAPI
document and sends them to a running service (a real ``ttc serve`` process in front of the fake
backend, an in-memory store, auth off so every route is reachable).

Every response must be: no 500 (a 502/503/504 is a documented answer: a tiny deadline, a backend); no
traceback; a non-2xx answer in the one error envelope; a status
code and content type that ``/openapi.json`` documents for the operation; a body that matches the
documented schema; and a request the document calls valid is accepted (``positive_data_acceptance``):
not refused for its shape. What the document cannot foresee is tolerated, and only that: a 404 for an id
nobody created (a model, a policy, a key, a batch), and the 400s of the rules listed in
:data:`UNSTATED`. Walking the links schemathesis infers (a policy's name, a batch's id), a resource is
readable once created and gone once deleted. Every resource answers ``OPTIONS`` with an ``Allow`` header
that lists exactly its documented methods. Bounded: a fixed seed and ``EXAMPLES`` examples per operation;
the walk, ``STATEFUL_EXAMPLES`` scenarios of ``STATEFUL_STEPS`` steps per run, at most ``STATEFUL_RUNS``
runs (random: see its test).
"""

from __future__ import annotations

import collections
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Flaky
from schemathesis import checks as st_checks
from schemathesis.config import SchemathesisConfig

from ttc_tools.bench import procs

pytestmark = pytest.mark.fuzz
EXAMPLES = 200
LOG = Path(__file__).resolve().parents[2] / ".logs" / "fuzz-service.log"
# A 404 is a positive request's answer only when it names an id the fuzzer made up: nobody serves that
# model, created that policy (or version), key or batch, or wrote that report (``name``: a policy or a UI
# report).
UNKNOWN_IDS = {"model", "batch_id", "after", "key_id", "name", "version", "policy", "ttc.policy", "default_policy"}
# The rules the document does not state (a fact about two fields, which JSON Schema states clumsily if at
# all, or about a value beyond its shape): a positive request may break them, and their 400 is the answer.
# (code, param, message), regular expressions.
UNSTATED: list[tuple[str, str, str]] = [
    # each allocator, verifier and answer kind validates its own params (free-form objects in the document)
    ("invalid_value|unknown_field", r"(.+\.)?params(\..*)?", ""),
    # a verifier-ranked aggregator, step-level search and compute-optimal need a (prm) verifier; a
    # verifier may need the request's reference or tests
    ("verifier_required|reference_required|tests_required", ".*", ""),
    # probes of running thoughts need the stream schedule
    ("unsupported_value", r"(.+\.)?schedule", "needs the stream schedule"),
    # a batch's budget buys at least one sample per prompt; references: one per prompt
    ("budget_too_small", r"(ttc\.)?budget\..+", ""),
    (".*", "references", r"^references has \d+ entries for \d+ prompts"),
    # compute-optimal: one table entry per bin, thresholds descending
    ("invalid_value", r"(.+\.)?optimal", "table needs one choice per bin|bins must be descending"),
    # code tests: Python source with assert statements (and check needs its entry_point)
    ("invalid_value", r"ttc\.tests", "Value error"),
]
ACCEPTED = ["2xx", "3xx", "401", "403", "409", "429", "5xx"]  # schemathesis's default, less 404 (see above)


@pytest.fixture(scope="module")
def service() -> Iterator[str]:
    with procs.fake_backend(0.0) as backend:
        port = procs.free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = [procs.ttc_exe(), "serve", "--port", str(port), "--backend", backend, "--log-level", "warning"]
        LOG.parent.mkdir(exist_ok=True)
        LOG.write_text("")
        with procs.process(cmd, url + "/ready", env={"TTC_STORE__URL": "sqlite+aiosqlite://"}, log=LOG):
            yield url


def envelope(response: schemathesis.Response) -> None:
    assert response.status_code != 500, f"{response.status_code}: {response.text[:500]}"
    assert "Traceback" not in response.text
    if response.status_code >= 400:
        body = json.loads(response.text)
        assert set(body["error"]) >= {"message", "type", "param", "code"}, body


def unforeseeable(response: schemathesis.Response, case: schemathesis.Case) -> bool:
    """A refusal the document cannot foresee: an unknown id's 404, a broken :data:`UNSTATED` rule's 400."""
    if response.status_code not in (400, 404):
        return False
    error: dict[str, Any] = json.loads(response.text)["error"]
    param, code, message = error.get("param") or "", error.get("code") or "", error.get("message") or ""
    if response.status_code == 404:  # or a made-up id the router cannot match (a '/', a line break): no param
        return param in UNKNOWN_IDS or (not param and code == "not_found" and bool(case.path_parameters))
    return any(re.fullmatch(c, code) and re.fullmatch(p, param, re.S) and re.search(m, message)
               for c, p, m in UNSTATED)


def positive_data_acceptance(ctx: Any, response: schemathesis.Response, case: schemathesis.Case) -> bool | None:
    """schemathesis's check (a request valid by the document is not refused), less the unforeseeable."""
    if unforeseeable(response, case):
        return None
    return st_checks.positive_data_acceptance(ctx, response, case)


CHECKS = [st_checks.status_code_conformance, st_checks.content_type_conformance,
          st_checks.response_schema_conformance,  # 502/503/504 (a deadline, a backend) are answers, 500 never
          positive_data_acceptance]
STATEFUL_CHECKS = [*CHECKS, st_checks.use_after_free, st_checks.ensure_resource_availability]
STATEFUL_EXAMPLES, STATEFUL_STEPS, STATEFUL_RUNS = 40, 8, 8


def load(service: str) -> Any:
    config = SchemathesisConfig.from_dict({"generation": {"mode": "positive"},  # the stateful walk's too
                                           "checks": {"positive_data_acceptance": {"expected-statuses": ACCEPTED}}})
    return schemathesis.openapi.from_url(service + "/openapi.json", config=config)


def test_every_response_is_documented_and_well_formed(service: str) -> None:
    schema = load(service)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 15
    failures: list[str] = []
    calls: dict[str, int] = {}
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def fuzz(case: schemathesis.Case) -> None:
            response = case.call(timeout=30)
            calls[operation.label] = calls.get(operation.label, 0) + 1  # noqa: B023 - used while defined
            envelope(response)
            case.validate_response(response, checks=CHECKS)

        try:
            fuzz()
        except (Exception, BaseExceptionGroup) as exc:  # schemathesis's FailureGroup is a BaseExceptionGroup
            failures.append(f"{operation.label}: {str(exc)[:800]}")
    assert not failures, "\n\n".join(failures) + "\n\nservice log:\n" + LOG.read_text()[-4000:]
    print(f"schemathesis: {sum(calls.values())} requests over {len(calls)} operations: {calls}")
    assert sum(calls.values()) >= 10 * len(operations)  # the fuzzer really ran


def test_linked_operations_keep_their_resources(service: str) -> None:
    """Stateful: schemathesis links the operations by the ids their responses carry (a policy's name, a
    key's id, a batch's id) and walks them; a resource is readable after its creation
    (``ensure_resource_availability``) and gone after its deletion (``use_after_free``). The service keeps
    its state between scenarios, so a scenario Hypothesis replays may draw differently (``Flaky``): that run
    ends and another starts; what fails is what a check found."""
    workflow = load(service).as_state_machine()
    failures: list[str] = []
    steps: list[str] = []

    class Checked(workflow):  # type: ignore[misc, valid-type]
        def validate_response(self, response: schemathesis.Response, case: schemathesis.Case,
                              additional_checks: Any = None, **kwargs: Any) -> None:
            steps.append(f"{case.method} {case.operation.path} {response.status_code}")
            try:
                envelope(response)
                case.validate_response(response, checks=STATEFUL_CHECKS, transport_kwargs=kwargs or None,
                                       recorder=self.recorder)
            except (Exception, BaseExceptionGroup) as exc:
                failures.append(f"{case.method} {case.formatted_path}: {str(exc)[:800]}")
                raise

    def deletes() -> list[str]:
        return [s for s in steps if s.startswith("DELETE") and s.endswith(("200", "204"))]

    for _ in range(STATEFUL_RUNS):  # a random walk may delete nothing in one run: walk on until it has, bounded
        if failures or (len(steps) >= STATEFUL_EXAMPLES * STATEFUL_STEPS // 2 and deletes()):
            break
        try:
            Checked.run(settings=settings(max_examples=STATEFUL_EXAMPLES, stateful_step_count=STATEFUL_STEPS,
                                          phases=[Phase.generate], deadline=None, database=None,
                                          suppress_health_check=list(HealthCheck)))
        except Flaky:  # a replay drew differently against the changed state (a check's failure is in failures)
            continue
        except (Exception, BaseExceptionGroup):
            if not failures:
                raise
    assert not failures, "\n\n".join(failures) + "\n\nservice log:\n" + LOG.read_text()[-4000:]
    print(f"stateful: {len(steps)} steps, {len(deletes())} deletions: {dict(collections.Counter(steps))}")
    assert len(steps) >= 2 * STATEFUL_EXAMPLES and deletes(), steps  # it walked the links, deleted something


def test_options_lists_exactly_the_documented_methods(service: str) -> None:
    schema = load(service)
    failures: list[str] = []
    seen: set[str] = set()
    for operation in (result.ok() for result in schema.get_all_operations()):
        if operation.path in seen:
            continue
        seen.add(operation.path)
        params = {p.name: "x" for p in operation.iter_parameters() if p.location.container_name == "path_parameters"}
        case = operation.Case(method="OPTIONS", path_parameters=params)
        response = case.call(timeout=30)
        assert response.headers.get("allow"), (operation.path, response.status_code)
        try:
            case.validate_response(response, checks=[st_checks.allow_header_conformance])
        except (Exception, BaseExceptionGroup) as exc:
            failures.append(f"{operation.path}: {str(exc)[:400]}")
    assert len(seen) >= 10 and not failures, "\n".join(failures)
