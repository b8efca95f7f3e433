"""A bounded schemathesis run against the served OpenAPI document: no 5xx, server still healthy."""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

pytestmark = pytest.mark.slow  # a few hundred generated requests

EXAMPLES_PER_OPERATION = 25


def test_openapi_fuzz_finds_no_server_error(server) -> None:
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 16  # every documented operation but /openapi.json, which schemathesis skips
    sent: list[tuple[str, int]] = []
    for operation in operations:
        _fuzz(operation, server.url, sent)()
    statuses = {status for _, status in sent}
    assert 200 in statuses and 400 in statuses  # the run reached real models and real refusals
    assert len(sent) >= 100
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200
    assert "Traceback" not in server.logs()


def _fuzz(operation, base_url: str, sent: list[tuple[str, int]]):
    """A hypothesis test sending generated cases for one operation; every answer must be < 500."""

    @given(case=operation.as_strategy())
    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def check(case) -> None:
        response = case.call(base_url=base_url, timeout=10)
        sent.append((operation.label, response.status_code))
        assert response.status_code < 500, f"{case.method} {case.formatted_path} -> {response.status_code}"
        if response.status_code >= 400:
            assert "error" in response.json(), response.text

    return check
