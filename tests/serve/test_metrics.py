"""Metrics tallied per event-loop iteration write exactly what prometheus_client's own updates would."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import prometheus_client as prom
from prometheus_client.parser import text_string_to_metric_families

from pipeline.serve.metrics import LATENCY_BUCKETS, Metrics

# Edges included: a value equal to a bound belongs to that bound's bucket; past the last, +Inf.
SECONDS = [0.0, 1e-4, 1.5e-4, 2.5e-4, 0.003, 0.003, 0.7, 30.0, 31.0]


def _samples(text: str, prefix: str) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k in ("le", "code")))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith(prefix) and not s.name.endswith("_created")
    }


def _record(metrics: Metrics) -> None:
    stats = metrics.model("m", 1)
    for seconds in SECONDS:
        stats.answered(seconds)
        stats.ran(1, seconds, seconds)
        metrics.count_response(200)
    stats.ran(2, 0.5, None)  # a request whose batch failed: queue time only
    stats.failed()
    stats.executed(3, 0.01)
    metrics.count_response(400)


def test_tallied_histograms_equal_prometheus_observe() -> None:
    metrics = Metrics()

    async def main() -> None:
        _record(metrics)
        await asyncio.sleep(0)  # the flush scheduled by the first update runs

    asyncio.run(main())
    assert not metrics._dirty
    expected = prom.CollectorRegistry()
    histogram = prom.Histogram("pipe_request_latency_seconds", "", ["model", "version"], registry=expected,
                               buckets=LATENCY_BUCKETS).labels("m", "1")  # fmt: skip
    for seconds in SECONDS:
        histogram.observe(seconds)
    text = metrics.render({}).decode()
    got = _samples(text, "pipe_request_latency_seconds")
    assert got == _samples(prom.generate_latest(expected).decode(), "pipe_request_latency_seconds")
    assert got[("pipe_request_latency_seconds_count", ())] == len(SECONDS)
    assert _samples(text, "pipe_request_queue_seconds")[("pipe_request_queue_seconds_count", ())] == len(SECONDS) + 1
    assert _samples(text, "pipe_request_compute_seconds")[("pipe_request_compute_seconds_count", ())] == len(SECONDS)
    assert _samples(text, "pipe_inference_count")[("pipe_inference_count_total", ())] == len(SECONDS)
    assert _samples(text, "pipe_request_failure")[("pipe_request_failure_total", ())] == 1
    assert _samples(text, "pipe_batch_size")[("pipe_batch_size_sum", ())] == 3
    responses = _samples(text, "pipe_http_responses")
    assert responses[("pipe_http_responses_total", (("code", "200"),))] == len(SECONDS)
    assert responses[("pipe_http_responses_total", (("code", "400"),))] == 1


def test_outside_an_event_loop_updates_are_written_at_once() -> None:
    metrics = Metrics()
    metrics.model("m", 1).answered(0.002)
    assert not metrics._dirty
    assert 'pipe_request_success_total{model="m",version="1"} 1.0' in prom.generate_latest(metrics._registry).decode()


def test_multiprocess_files_hold_the_tallies(tmp_path) -> None:
    """Two processes writing through PROMETHEUS_MULTIPROC_DIR (as --workers does) sum to every update."""
    code = (
        "import asyncio\n"
        "from pipeline.serve.metrics import Metrics\n"
        "m = Metrics()\n"
        "async def main():\n"
        "    for _ in range(50):\n"
        "        m.model('m', 1).answered(0.001); m.count_response(200)\n"
        "    await asyncio.sleep(0)\n"
        "asyncio.run(main())\n"
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    for _ in range(2):
        subprocess.run([sys.executable, "-c", code], env=env, check=True)
    code = "from pipeline.serve.metrics import Metrics; print(Metrics().render({}).decode())"
    text = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True).stdout
    assert _samples(text, "pipe_request_success")[("pipe_request_success_total", ())] == 100
    assert _samples(text, "pipe_request_latency_seconds")[("pipe_request_latency_seconds_count", ())] == 100
    assert _samples(text, "pipe_http_responses")[("pipe_http_responses_total", (("code", "200"),))] == 100
