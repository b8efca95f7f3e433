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

The handlers are functions `(state, request)` that the route table (`app.ROUTES`) holds; below them,
the JSON each one writes.
"""

from __future__ import annotations

from typing import Any

from pipeline.serve.batching import BatchSettings
from pipeline.serve.errors import RequestError
from pipeline.serve.protocols import v2
from pipeline.serve.protocols.datatypes import IOSpec
from pipeline.serve.responses import Response, json_response
from pipeline.serve.routes import Request
from pipeline.serve.state import ServeState

_NS = 1e9


async def model_config(state: ServeState, request: Request) -> Response:
    model = state.repo().get(request.model_name, request.version, request.label)
    kind = "KIND_GPU" if "CUDAExecutionProvider" in model.session.providers else "KIND_CPU"
    config = _config(
        model.name, model.session.inputs, model.session.outputs, model.session.batchable, state.config.batching,
        model.file, state.config.repository.latest, kind,
    )  # fmt: skip
    return json_response(config)


async def model_stats(state: ServeState, request: Request) -> Response:
    repo, name = state.repo(), request.model_name
    assert name is not None
    if request.version is None and request.label is None:
        versions = sorted(repo.get_all(name))
    else:
        versions = [repo.get(name, request.version, request.label).version]
    return _stats(state, {name: versions})


async def every_model_stats(state: ServeState, request: Request) -> Response:
    return _stats(state, {name: sorted(versions) for name, versions in sorted(state.repo().models.items())})


def _stats(state: ServeState, versions: dict[str, list[int]]) -> Response:
    totals = state.metrics.totals()
    entries = [_version_stats(name, v, totals.get((name, v), {})) for name, vs in versions.items() for v in vs]
    return json_response({"model_stats": entries})


async def repository_index(state: ServeState, request: Request) -> Response:
    asked = v2.parse_json(request.body, "the repository index request") if request.body.strip() else {}
    if not isinstance(asked, dict) or not isinstance(asked.get("ready", False), bool):
        raise RequestError(f'the repository index request must be {{}} or {{"ready": true|false}}, got {asked!r:.80}')
    repo = state.repo()
    entries = [
        _index_entry(name, version, served, reason)
        for name in sorted(repo.names())
        for version, (served, reason) in sorted(repo.states(name).items())
        if served or not asked.get("ready", False)
    ]
    return json_response(entries)


# -- the JSON answers --------------------------------------------------------------------------------


def _data_type(datatype: str) -> str:
    """A V2 datatype as Triton's config writes it: TYPE_FP32 ..., BYTES as TYPE_STRING."""
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def _config(
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


def _version_stats(name: str, version: int, totals: dict[str, float]) -> dict[str, Any]:
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


def _index_entry(name: str, version: int, served: bool, reason: str) -> dict[str, str]:
    """One model version in the repository index."""
    entry = {"name": name, "version": str(version), "state": "READY" if served else "UNAVAILABLE"}
    if reason:
        entry["reason"] = reason
    return entry
