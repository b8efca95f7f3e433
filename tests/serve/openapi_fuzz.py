"""Fuzz a running `pipe serve` from its own /openapi.json with schemathesis, bounded by a case count.

Every operation gets the same number of generated cases, positive (valid for the schema) and
negative (violating it). Each answer goes through schemathesis' checks: no 5xx, a status code, a
content type and a body that the document declares, schema-invalid requests refused, and the
headers the document promises. A module of its own so the suite's small run
(tests/serve/test_fuzz.py) and the 2,000-case run (bench/fuzz_serve.py) share it.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import load_all_checks
from schemathesis.core.failures import Failure, FailureGroup
from schemathesis.generation import GenerationMode

load_all_checks()
from schemathesis.specs.openapi import checks as openapi_checks  # noqa: E402  (registered by load_all_checks)

CHECKS = [
    openapi_checks.status_code_conformance,
    openapi_checks.content_type_conformance,
    openapi_checks.response_schema_conformance,
    openapi_checks.response_headers_conformance,
    openapi_checks.negative_data_rejection,
]


@dataclass
class FuzzResult:
    """What one run sent and what it found."""

    cases: int = 0
    statuses: collections.Counter[int] = field(default_factory=collections.Counter)
    server_errors: list[str] = field(default_factory=list)  # "METHOD PATH -> 5xx"
    mismatches: list[str] = field(default_factory=list)  # schemathesis check failures, one line each
    operations: int = 0


def fuzz(base_url: str, cases_per_operation: int, seed: int = 0, paths: tuple[str, ...] = ()) -> FuzzResult:
    """Send `cases_per_operation` generated requests (half positive, half negative) to every operation, or to
    those whose path ends with one of `paths`."""
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    if paths:
        operations = [o for o in operations if o.path.endswith(paths)]
    result = FuzzResult(operations=len(operations))
    positive = cases_per_operation - cases_per_operation // 2
    for operation in operations:
        for mode, count in (
            (GenerationMode.POSITIVE, positive),
            (GenerationMode.NEGATIVE, cases_per_operation - positive),
        ):
            if count:
                _run(operation, mode, count, base_url, seed, result)
    return result


def _run(operation, mode: GenerationMode, count: int, base_url: str, seed: int, result: FuzzResult) -> None:
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=count,
        derandomize=seed == 0,
        deadline=None,
        database=None,
        phases=[Phase.generate],  # failures are collected, not raised: nothing to shrink
        suppress_health_check=list(HealthCheck),
    )
    def send(case) -> None:
        response = case.call(base_url=base_url, timeout=15)
        result.cases += 1
        result.statuses[response.status_code] += 1
        where = f"{case.method} {case.formatted_path} ({mode.value})"
        if response.status_code >= 500:
            result.server_errors.append(f"{where} -> {response.status_code}: {response.text[:200]}")
        try:
            case.validate_response(response, checks=CHECKS)
        except (Failure, FailureGroup, AssertionError) as exc:
            sent = "" if case.body is None else f" (body {case.body!r:.300})"
            result.mismatches.append(f"{where} -> {response.status_code}: {_one_line(exc)}{sent}")

    try:
        send()
    except Unsatisfiable:  # nothing to make invalid (no parameters, no body): only positive cases exist
        if mode is GenerationMode.POSITIVE:
            raise


def _one_line(exc: BaseException) -> str:
    failures = getattr(exc, "exceptions", None) or [exc]
    return "; ".join(
        getattr(f, "title", type(f).__name__) + ": " + str(f).strip().splitlines()[0][:160] for f in failures
    )
