"""Prometheus metrics through prometheus_client, summed across every `--workers` process.

Per model version: request successes and failures, inferences (rows) and executions (onnxruntime
calls; inferences / executions is the average batch size), cumulative queue, compute and request
time (the counters kept from before), and histograms of each request's queue, compute and total
time and of each execution's batch size; gauges of the requests in each version's batcher
(`pipe_queue_depth`) and being answered (`pipe_requests_in_flight`), summed over live workers; and
the repository's loads by outcome (`pipe_model_loads_total`). Counters only grow; a model unloaded by hot reload keeps
its last values so rates stay sane.

Several workers: `pipe serve` points PROMETHEUS_MULTIPROC_DIR at a temporary directory it owns
(`server.run`) before any worker starts, every worker writes its values there, and a scrape,
whichever worker answers it, sums them all. prometheus_client reads that variable when it is first
imported, so it is imported here inside `Metrics()`, never at module level.

Updates are tallied in plain Python and written to prometheus_client once per event-loop
iteration (a batch's requests together), not once per request: in multiprocess mode every write
takes a lock, checks the pid and packs into the mmap file, about 1 us each, and a request made
eleven of them (a tenth of a small model's CPU per request). Nothing is lost or approximated: the
tallies are exact counts and sums, written before the worker reads its next request, and a
scrape writes this worker's own first.
"""

from __future__ import annotations

import asyncio
import bisect
import os
from collections.abc import Awaitable, Callable
from typing import Any

from pipeline.serve.asgi import App, Message, Receive, Scope, Send
from pipeline.serve.generation.stats import FAMILIES as GENERATION_FAMILIES
from pipeline.serve.generation.stats import GenerationStats

MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"  # the name prometheus_client reads
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LABELS = ("model", "version")
# Seconds: from 0.1 ms (a small MLP's run) to 30 s (the default --timeout).
LATENCY_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)  # rows per onnxruntime run


class _Tally:
    """One histogram child's observations not yet written: a count per bucket and their sum."""

    __slots__ = ("_bounds", "_child", "_counts", "_sum")

    def __init__(self, child: Any) -> None:
        # prometheus_client's Histogram child keeps its bounds (+Inf last), one value per bucket
        # (not cumulative) and the sum in these attributes; observe() has no form taking a count.
        # tests/serve/test_metrics.py checks the written result equals observe()'s.
        self._child = child
        self._bounds: list[float] = child._upper_bounds
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0

    def observe(self, value: float) -> None:
        self._counts[bisect.bisect_left(self._bounds, value)] += 1  # the first bound >= value, as observe()
        self._sum += value

    def flush(self) -> None:
        if not any(self._counts):
            return
        self._child._sum.inc(self._sum)
        for i, count in enumerate(self._counts):
            if count:
                self._child._buckets[i].inc(count)
                self._counts[i] = 0
        self._sum = 0.0


_HISTOGRAMS = ("queue", "compute", "request", "batch")
_PER_VERSION = ("success", "failure", "inferences", "executions", "queue_total", "compute_total", "request_total",
                *_HISTOGRAMS)  # fmt: skip
# Sample name -> the key of `Metrics.totals` (Triton's statistics are made from these).
_TOTALS = {
    "pipe_request_success_total": "success",
    "pipe_request_failure_total": "failure",
    "pipe_inference_count_total": "inferences",
    "pipe_execution_count_total": "executions",
    "pipe_queue_duration_seconds_total": "queue_total",
    "pipe_request_duration_seconds_total": "request_total",
    "pipe_request_queue_seconds_count": "queue_count",
    "pipe_request_compute_seconds_count": "compute_count",
    "pipe_request_compute_seconds_sum": "compute_seconds",
}


class ModelStats:
    """The metrics of one model version; updated from the event loop thread, written by `Metrics.flush`."""

    def __init__(self, families: dict[str, Any], name: str, version: int, touch: Callable[[], None]) -> None:
        children = {key: family.labels(name, str(version)) for key, family in families.items() if key in _PER_VERSION}
        self._counters = {key: child for key, child in children.items() if key not in _HISTOGRAMS}
        self._tallies = {key: _Tally(children[key]) for key in _HISTOGRAMS}
        self._added = dict.fromkeys(self._counters, 0.0)  # counter increments not yet written
        self._touch = touch
        self._depth = families["depth"].labels(name, str(version))
        self.waiting = 0  # requests of this version in its batcher now (queued or computing), this process
        # This process's own totals (the exported ones sum every worker): rows and runs, for tests and logs.
        self.inferences = 0
        self.executions = 0

    def answered(self, seconds: float) -> None:
        """A request answered with outputs, `seconds` from decode to encode."""
        added = self._added
        added["success"] += 1
        added["request_total"] += seconds
        self._tallies["request"].observe(seconds)
        self._touch()

    def failed(self) -> None:
        """A request refused or failed after reaching this model."""
        self._added["failure"] += 1
        self._touch()

    def executed(self, rows: int, compute_s: float) -> None:
        """One onnxruntime run of `rows` rows."""
        self.executions += 1
        added = self._added
        added["executions"] += 1
        added["compute_total"] += compute_s
        self._tallies["batch"].observe(rows)
        self._touch()

    def ran(self, rows: int, queue_s: float, compute_s: float | None) -> None:
        """One request's share of a run: its wait, and its batch's compute time when it got outputs."""
        added = self._added
        added["queue_total"] += queue_s
        self._tallies["queue"].observe(queue_s)
        if compute_s is not None:
            self.inferences += rows
            added["inferences"] += rows
            self._tallies["compute"].observe(compute_s)
        self._touch()

    def queued(self, change: int) -> None:
        """A request entered (+1) or left (-1) this version's batcher."""
        self.waiting += change
        self._touch()

    def flush(self) -> None:
        """Write the tallied updates to prometheus_client (shared files with several workers)."""
        self._depth.set(self.waiting)
        for key, amount in self._added.items():
            if amount:
                self._counters[key].inc(amount)
                self._added[key] = 0.0
        for tally in self._tallies.values():
            tally.flush()


class Metrics:
    """Every metric of one server process, rendered on GET /metrics (all workers' values summed)."""

    def __init__(self) -> None:
        import prometheus_client as prom
        from prometheus_client import multiprocess

        self._prom = prom
        self._registry = prom.CollectorRegistry()
        shared = os.environ.get(MULTIPROCESS_ENV)
        if shared:  # values live in files in that directory; the collector sums every process's files
            multiprocess.MultiProcessCollector(self._registry, path=shared)
        into = None if shared else self._registry

        def counter(name: str, text: str, labels: tuple[str, ...] = _LABELS) -> Any:
            return prom.Counter(name, text, labels, registry=into)

        def histogram(name: str, text: str, buckets: tuple[float, ...]) -> Any:
            return prom.Histogram(name, text, _LABELS, registry=into, buckets=buckets)

        def gauge(name: str, text: str, labels: tuple[str, ...] = _LABELS) -> Any:  # summed over live workers
            return prom.Gauge(name, text, labels, registry=into, multiprocess_mode="livesum")

        self._families = {
            "success": counter("pipe_request_success", "Inference requests answered with outputs."),
            "failure": counter("pipe_request_failure", "Inference requests that failed or were refused."),
            "inferences": counter("pipe_inference_count", "Rows inferred (batch dim summed over requests)."),
            "executions": counter("pipe_execution_count", "onnxruntime runs (inference_count / this = batch)."),
            "queue_total": counter("pipe_queue_duration_seconds", "Seconds requests waited in the queue."),
            "compute_total": counter("pipe_compute_duration_seconds", "Seconds batches spent computing."),
            "request_total": counter("pipe_request_duration_seconds", "Seconds from decode to encode."),
            "queue": histogram("pipe_request_queue_seconds", "Per request: seconds waiting for its batch.",
                               LATENCY_BUCKETS),
            "compute": histogram("pipe_request_compute_seconds", "Per request: seconds its batch computed.",
                                 LATENCY_BUCKETS),
            "request": histogram("pipe_request_latency_seconds", "Per request: seconds from decode to encode.",
                                 LATENCY_BUCKETS),
            "batch": histogram("pipe_batch_size", "Per onnxruntime run: rows in the batch.", BATCH_BUCKETS),
            "http": counter("pipe_http_responses", "HTTP responses by status code.", ("code",)),
            "depth": gauge("pipe_queue_depth", "Requests in a model version's batcher now (queued or computing)."),
            "in_flight": gauge("pipe_requests_in_flight", "HTTP requests being answered now.", ()),
            "loads": counter("pipe_model_loads", "Model version loads by outcome (loaded, reloaded, refused, "
                             "unloaded); every worker loads each version.", ("model", "outcome")),
        }  # fmt: skip
        for key, (kind, name, text, buckets) in GENERATION_FAMILIES.items():  # text-generation models
            self._families[key] = (histogram(name, text, buckets) if kind == "histogram" else
                                   counter(name, text) if kind == "counter" else gauge(name, text))  # fmt: skip
        self._models: dict[tuple[str, int], ModelStats] = {}
        self._responses: dict[int, int] = {}  # HTTP status -> responses not yet written
        self.in_flight = 0  # HTTP requests this process is answering now
        self._dirty = False  # a flush is scheduled

    def model(self, name: str, version: int) -> ModelStats:
        key = (name, version)
        if key not in self._models:
            self._models[key] = ModelStats(self._families, name, version, self._touch)
        return self._models[key]

    def generation(self, name: str, version: int) -> GenerationStats:
        """A text-generation version's metrics (generation/stats.py)."""
        return GenerationStats(self._families, name, version)

    def loaded(self, name: str, outcome: str) -> None:
        """The repository loaded, reloaded, refused or unloaded a version of `name` (rare: written now)."""
        self._families["loads"].labels(name, outcome).inc()

    def started(self, change: int) -> None:
        """An HTTP request began (+1) or was answered (-1)."""
        self.in_flight += change
        self._touch()

    def count_response(self, status: int) -> None:
        self._responses[status] = self._responses.get(status, 0) + 1
        self._touch()

    def _touch(self) -> None:
        """Something was tallied: write it once the event loop finishes what is ready now."""
        if self._dirty:
            return
        self._dirty = True
        try:
            asyncio.get_running_loop().call_soon(self.flush)
        except RuntimeError:  # called outside an event loop: write now
            self.flush()

    def flush(self) -> None:
        """Write every tallied update to prometheus_client."""
        self._dirty = False
        self._families["in_flight"].set(self.in_flight)
        for stats in self._models.values():
            stats.flush()
        for status, count in self._responses.items():
            self._families["http"].labels(str(status)).inc(count)
        self._responses.clear()

    def totals(self) -> dict[tuple[str, int], dict[str, float]]:
        """(model, version) -> its counters and histogram sums, every worker's summed (see `_TOTALS`)."""
        self.flush()
        totals: dict[tuple[str, int], dict[str, float]] = {}
        for family in self._registry.collect():
            for sample in family.samples:
                key = _TOTALS.get(sample.name)
                if key is not None and "version" in sample.labels:
                    labels = sample.labels
                    totals.setdefault((labels["model"], int(labels["version"])), {})[key] = sample.value
        return totals

    def render(self, ready: dict[tuple[str, int], bool]) -> bytes:
        """The Prometheus text format (version 0.0.4): every worker's counts, and this worker's readiness."""
        from prometheus_client.core import GaugeMetricFamily

        self.flush()  # this worker's own latest counts; the others' are written within a loop iteration

        gauge = GaugeMetricFamily("pipe_model_ready", "1 when the model version serves requests.", labels=_LABELS)
        for (name, version), is_ready in sorted(ready.items()):
            gauge.add_metric([name, str(version)], int(is_ready))
        readiness = self._prom.CollectorRegistry()
        readiness.register(_Fixed([gauge]))
        return self._prom.generate_latest(self._registry) + self._prom.generate_latest(readiness)


class _Fixed:
    """A collector yielding metric families made at scrape time."""

    def __init__(self, families: list[Any]) -> None:
        self._families = families

    def collect(self) -> Any:
        return iter(self._families)


class CountResponses:
    """An ASGI wrapper counting every HTTP answer by status (`pipe_http_responses_total`), whichever layer gave it,
    and the requests being answered (`pipe_requests_in_flight`)."""

    def __init__(self, app: App, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        count = self.metrics.count_response

        def counted(message: Message) -> Awaitable[None]:  # send's own awaitable: no coroutine of its own
            if message["type"] == "http.response.start":
                count(message["status"])
            return send(message)

        self.metrics.started(1)
        try:
            await self.app(scope, receive, counted)
        finally:
            self.metrics.started(-1)
