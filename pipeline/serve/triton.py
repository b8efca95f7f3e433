"""Triton's model repository extension, read-only: model configuration, statistics and the repository index.

Tools written for Triton read these before anything else (`tritonclient`'s `get_model_config`,
`get_inference_statistics`, `get_model_repository_index`; perf_analyzer reads the config first to
learn the batch size and the inputs):
- `GET /v2/models/{m}[/versions/{v}]/config`: Triton's model configuration as JSON (the fields of
  its model_config.proto that describe a served ONNX model): max_batch_size, inputs and outputs
  without the batch dim when batching is on, the version policy, dynamic batching, instances;
- `GET /v2/models[/{m}[/versions/{v}]]/stats`: Triton's statistics, made from the same counters as
  /metrics (so summed over every worker);
- `POST /v2/repository/index`: every model version found, READY or UNAVAILABLE with the reason.
Loading and unloading through the API (`/v2/repository/models/{m}/load`) is not offered: the
repository on disk is the one source of what is served (hot reload, `pipe promote`).
"""

from __future__ import annotations

from typing import Any

from pipeline.serve.batching import BatchSettings
from pipeline.serve.protocols.datatypes import IOSpec

_NS = 1e9


def _data_type(datatype: str) -> str:
    """A V2 datatype as Triton's config writes it: TYPE_FP32 ..., BYTES as TYPE_STRING."""
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def model_config(
    name: str,
    inputs: list[IOSpec],
    outputs: list[IOSpec],
    batchable: bool,
    batching: BatchSettings,
    file: str,
    latest: int | None,
    provider_kind: str,
) -> dict[str, Any]:
    """Triton's JSON model configuration of one served version (`provider_kind`: KIND_CPU or KIND_GPU)."""
    max_batch = batching.max_batch_size if batchable else 0

    def tensors(specs: list[IOSpec]) -> list[dict[str, Any]]:
        return [
            {"name": s.name, "data_type": _data_type(s.datatype), "dims": list(s.shape[1:] if max_batch else s.shape)}
            for s in specs
        ]

    config: dict[str, Any] = {
        "name": name,
        "platform": "onnxruntime_onnx",
        "backend": "onnxruntime",
        "version_policy": {"latest": {"num_versions": latest}} if latest else {"all": {}},
        "max_batch_size": max_batch,
        "input": tensors(inputs),
        "output": tensors(outputs),
        "instance_group": [{"name": name, "kind": provider_kind, "count": batching.instances}],
        "default_model_filename": file,
        "parameters": {},
    }
    if max_batch:
        config["dynamic_batching"] = {
            "max_queue_delay_microseconds": int(batching.max_queue_delay_ms * 1000),
            "default_queue_policy": {
                "timeout_action": "REJECT",
                "default_timeout_microseconds": int(batching.timeout_s * 1e6),
                "max_queue_size": batching.max_queue,
            },
        }
    return config


def _duration(count: float, seconds: float) -> dict[str, int]:
    return {"count": int(count), "ns": int(seconds * _NS)}


def model_stats(name: str, version: int, totals: dict[str, float]) -> dict[str, Any]:
    """One version's entry in Triton's statistics, from `Metrics.totals` (every worker's counts)."""
    get = totals.get
    zero = _duration(0, 0)
    return {
        "name": name,
        "version": str(version),
        "last_inference": 0,  # not kept: /metrics has the rates
        "inference_count": int(get("inferences", 0)),
        "execution_count": int(get("executions", 0)),
        "inference_stats": {
            "success": _duration(get("success", 0), get("request_total", 0)),
            "fail": _duration(get("failure", 0), 0),
            "queue": _duration(get("queue_count", 0), get("queue_total", 0)),
            "compute_input": zero,
            "compute_infer": _duration(get("compute_count", 0), get("compute_seconds", 0)),
            "compute_output": zero,
            "cache_hit": zero,
            "cache_miss": zero,
        },
        "batch_stats": [],
    }


def index_entry(name: str, version: int, served: bool, reason: str) -> dict[str, str]:
    """One model version in the repository index."""
    entry = {"name": name, "version": str(version), "state": "READY" if served else "UNAVAILABLE"}
    if reason:
        entry["reason"] = reason
    return entry
