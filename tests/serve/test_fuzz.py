"""A bounded schemathesis run against the served OpenAPI document: no 5xx, and every answer as documented.

The 2,000-case run of the same code is `bench/fuzz_serve.py`.
"""

from __future__ import annotations

import httpx
import pytest

from tests.serve.openapi_fuzz import fuzz

pytestmark = pytest.mark.slow  # a few hundred generated requests

CASES_PER_OPERATION = 24  # half positive, half negative; about 10 s


def test_openapi_fuzz_finds_no_server_error_and_no_schema_mismatch(server) -> None:
    result = fuzz(server.url, CASES_PER_OPERATION)
    assert result.operations == 42  # every documented operation but /openapi.json, which schemathesis skips
    assert result.server_errors == []
    assert result.mismatches == []
    assert result.statuses[200] > 0 and result.statuses[400] > 0  # it reached real models and real refusals
    assert result.cases >= 150
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200
    assert "Traceback" not in server.logs()
