"""Prometheus metrics in the text exposition format, kept in plain counters (no extra dependency).

Per model version: request successes and failures, inferences (rows) and executions (onnxruntime
calls; inferences / executions is the average batch size), and cumulative queue, compute and request
time. Counters only grow; a model unloaded by hot reload keeps its last values so rates stay sane.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class ModelStats:
    """Cumulative counters for one model version. Updated only from the event loop thread."""

    success: int = 0  # requests answered with outputs
    failure: int = 0  # requests refused or failed after reaching this model
    inferences: int = 0  # rows inferred (a request of shape [8, ...] counts 8)
    executions: int = 0  # onnxruntime runs; inferences / executions = average batch size
    queue_seconds: float = 0.0  # time requests waited before their batch started
    compute_seconds: float = 0.0  # time batches spent in onnxruntime
    request_seconds: float = 0.0  # end to end, decode to encode


_HELP = {
    "success": ("pipe_request_success_total", "counter", "Inference requests answered with outputs."),
    "failure": ("pipe_request_failure_total", "counter", "Inference requests that failed or were refused."),
    "inferences": ("pipe_inference_count_total", "counter", "Rows inferred (batch dim summed over requests)."),
    "executions": ("pipe_execution_count_total", "counter", "onnxruntime runs (inference_count / this = batch)."),
    "queue_seconds": ("pipe_queue_duration_seconds_total", "counter", "Seconds requests waited in the queue."),
    "compute_seconds": ("pipe_compute_duration_seconds_total", "counter", "Seconds batches spent computing."),
    "request_seconds": ("pipe_request_duration_seconds_total", "counter", "Seconds from decode to encode."),
}


class Metrics:
    """All counters of one server process, rendered on GET /metrics."""

    def __init__(self) -> None:
        self.models: dict[tuple[str, int], ModelStats] = {}
        self.http: dict[int, int] = {}  # status code -> responses sent

    def model(self, name: str, version: int) -> ModelStats:
        return self.models.setdefault((name, version), ModelStats())

    def count_response(self, status: int) -> None:
        self.http[status] = self.http.get(status, 0) + 1

    def render(self, ready: dict[tuple[str, int], bool]) -> str:
        """The Prometheus text format (version 0.0.4)."""
        lines: list[str] = []
        for f in fields(ModelStats):
            metric, kind, text = _HELP[f.name]
            lines += [f"# HELP {metric} {text}", f"# TYPE {metric} {kind}"]
            for (name, version), stats in sorted(self.models.items()):
                lines.append(f'{metric}{{model="{_escape(name)}",version="{version}"}} {getattr(stats, f.name)}')
        lines += ["# HELP pipe_model_ready 1 when the model version serves requests.", "# TYPE pipe_model_ready gauge"]
        for (name, version), is_ready in sorted(ready.items()):
            lines.append(f'pipe_model_ready{{model="{_escape(name)}",version="{version}"}} {int(is_ready)}')
        lines += [
            "# HELP pipe_http_responses_total HTTP responses by status code.",
            "# TYPE pipe_http_responses_total counter",
        ]
        for code, count in sorted(self.http.items()):
            lines.append(f'pipe_http_responses_total{{code="{code}"}} {count}')
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
