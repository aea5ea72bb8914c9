"""A schema fuzzer in ``make test``: schemathesis generates requests from the service's own OpenAPI
document and sends them to a running service (a real ``ttc serve`` process in front of the fake
backend, an in-memory store, auth off so every route is reachable).

Every response must be: no 500 (a 502/503/504 is a documented answer: a tiny deadline, a backend); no
traceback; a non-2xx answer in the one error envelope; a status
code and content type that ``/openapi.json`` documents for the operation; a body that matches the
documented schema. Bounded: a fixed seed and ``EXAMPLES`` examples per operation.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import checks as st_checks

from ttc_tools.bench import procs

pytestmark = pytest.mark.fuzz
EXAMPLES = 200
LOG = Path(__file__).resolve().parents[2] / ".logs" / "fuzz-service.log"


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


CHECKS = [st_checks.status_code_conformance, st_checks.content_type_conformance,
          st_checks.response_schema_conformance]  # 502/503/504 (a deadline, a backend) are answers, 500 never


def test_every_response_is_documented_and_well_formed(service: str) -> None:
    schema = schemathesis.openapi.from_url(service + "/openapi.json")
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
        except Exception as exc:
            failures.append(f"{operation.label}: {str(exc)[:800]}")
    assert not failures, "\n\n".join(failures) + "\n\nservice log:\n" + LOG.read_text()[-4000:]
    print(f"schemathesis: {sum(calls.values())} requests over {len(calls)} operations: {calls}")
    assert sum(calls.values()) >= 10 * len(operations)  # the fuzzer really ran
