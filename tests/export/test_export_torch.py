"""torch -> ONNX through the parity gate, on tiny modules of every zoo family and on broken ones."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from pipeline.artifact.manifest import ModelSpec
from pipeline.artifact.tensors import TensorSpec
from pipeline.core.errors import CheckFailed, InputError
from pipeline.export.onnx_export import export_module
from pipeline.runtime.runners import torch_runner
from pipeline.samples.evaluation import EvaluationSet
from pipeline.verify.gate import verify
from pipeline.verify.policies import Exact
from tests.export.export_models import CNN, MLP, SEQ, VOCAB, BranchesOnBatch, GridSampler, MoE, Transformer

LOGITS = [TensorSpec("logits", "float32", ["batch", 3])]


def features(shape: tuple[int, ...]) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((20, *shape)).astype(np.float32)


def tokens() -> np.ndarray:
    return np.random.default_rng(0).integers(0, VOCAB, (20, SEQ)).astype(np.int64)


# name -> (module factory, input spec, 20 samples)
CASES = {
    "mlp": (MLP, TensorSpec("input", "float32", ["batch", 6]), lambda: features((6,))),
    "cnn": (CNN, TensorSpec("input", "float32", ["batch", 1, 8, 8], "NCHW"), lambda: features((1, 8, 8))),
    "transformer": (Transformer, TensorSpec("tokens", "int64", ["batch", "sequence"], "NT"), tokens),
    "moe": (MoE, TensorSpec("tokens", "int64", ["batch", "sequence"], "NT"), tokens),
}


def export_and_verify(module: torch.nn.Module, spec: TensorSpec, samples: np.ndarray, path: Path, **kw):
    torch.manual_seed(0)
    result = export_module(module, (torch.from_numpy(samples[:2]),), [spec], LOGITS, path, **kw)
    target = np.random.default_rng(1).integers(0, 3, len(samples))
    given = EvaluationSet.of({spec.name: samples}, ({spec.name: samples}, target))
    report = verify(path, torch_runner(module, [spec], LOGITS), given, ModelSpec([spec], LOGITS), Exact())
    return result, report


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(CASES))
def test_every_family_exports_with_dynamo_and_passes_the_gate(family: str, tmp_path: Path) -> None:
    factory, spec, make = CASES[family]
    torch.manual_seed(0)
    result, report = export_and_verify(factory(), spec, make(), tmp_path / "model.onnx")
    assert result.exporter == "dynamo" and result.fallback_reason is None and result.opset == 18
    assert report.passed, report.table()
    checks = {r.check for r in report.rows}
    assert {"checker", "shape inference", "batch 1", "batch 2", "batch 16", "metric accuracy"} <= checks
    if spec.layout == "NT":  # token models: a second sequence length ran too
        assert f"batch 2, sequence {SEQ // 2}" in checks
    graph_input = onnx.load(str(tmp_path / "model.onnx")).graph.input[0]
    dims = [d.dim_param or d.dim_value for d in graph_input.type.tensor_type.shape.dim]
    assert dims == spec.shape
    assert report.metric["difference"] == 0.0


@pytest.mark.slow
def test_model_branching_on_batch_size_fails_the_gate_naming_output_and_diff(tmp_path: Path) -> None:
    spec = TensorSpec("input", "float32", ["batch", 6])
    torch.manual_seed(0)
    result, report = export_and_verify(BranchesOnBatch(), spec, features((6,)), tmp_path / "model.onnx")
    # torch.export refuses the batch-dependent branch; the traced fallback bakes in the batch-2 branch.
    assert result.exporter == "torchscript"
    assert result.fallback_reason is not None and "TorchExportError" in result.fallback_reason
    failed = {(r.check, r.output) for r in report.failures}
    assert ("batch 1", "logits") in failed and ("batch 16", "logits") in failed
    assert ("batch 2", "logits") not in failed  # the traced size itself matches: only other sizes reveal it
    row = next(r for r in report.failures if r.check == "batch 1")
    assert row.max_abs is not None and row.max_abs > 1e-2 and "exceed atol" in row.detail
    with pytest.raises(CheckFailed) as caught:
        report.raise_on_failure("model.onnx")
    assert caught.value.exit_code == 1
    message = str(caught.value)
    assert "batch 1" in message and "logits" in message and f"{row.max_abs:.3g}" in message


@pytest.mark.slow
def test_torchscript_exporter_on_request(tmp_path: Path) -> None:
    factory, spec, make = CASES["mlp"]
    result, report = export_and_verify(factory(), spec, make(), tmp_path / "model.onnx", exporter="torchscript")
    assert result.exporter == "torchscript" and result.fallback_reason is None
    assert report.passed, report.table()


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_operator_missing_from_the_chosen_opset_is_named_with_the_opset_that_has_it(
    exporter: str, tmp_path: Path
) -> None:
    spec = TensorSpec("input", "float32", ["batch", 1, 8, 8], "NCHW")
    out = [TensorSpec("logits", "float32", ["batch", 16])]
    with pytest.raises(InputError) as caught:
        export_module(
            GridSampler(), (torch.zeros(2, 1, 8, 8),), [spec], out, tmp_path / "m.onnx", opset=15, exporter=exporter
        )
    message = str(caught.value)
    assert "15" in message and "opset 16" in message
    assert ("GridSample" if exporter == "dynamo" else "grid_sampler") in message


def test_unknown_exporter_is_refused(tmp_path: Path) -> None:
    spec = CASES["mlp"][1]
    with pytest.raises(InputError, match="'jit' is not one of dynamo, torchscript"):
        export_module(MLP(), (torch.zeros(2, 6),), [spec], LOGITS, tmp_path / "m.onnx", exporter="jit")


def test_weights_go_to_external_data_only_past_the_protobuf_limit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from pipeline.export import onnx_export

    big = torch.nn.Linear(30_000, 20_000, device="meta")  # 2.4 GB of fp32 weights, no memory used
    assert onnx_export.needs_external_data(big) and not onnx_export.needs_external_data(MLP())
    # The external-data path itself, on a small model: lower the threshold instead of allocating gigabytes.
    monkeypatch.setattr(onnx_export, "EXTERNAL_DATA_BYTES", 100)
    factory, spec, make = CASES["mlp"]
    result, report = export_and_verify(factory(), spec, make(), tmp_path / "model.onnx")
    assert result.external_data and (tmp_path / "model.onnx.data").stat().st_size > 0
    assert report.passed, report.table()


def test_a_token_id_past_the_embedding_table_is_named_not_called_untraceable(tmp_path: Path) -> None:
    """Example ids past an nn.Embedding's rows failed both exporters, and the advice was to make forward()
    traceable: the message names the table's size and the ids instead (issue 31)."""
    spec = TensorSpec("tokens", "int64", ["batch", "sequence"], "NT")
    past = torch.full((2, SEQ), VOCAB + 3, dtype=torch.int64)
    with pytest.raises(InputError) as caught:
        export_module(Transformer(), (past,), [spec], LOGITS, tmp_path / "m.onnx", exporter="torchscript")
    message = str(caught.value)
    assert "traceable" not in message
    assert "index out of range" in message and "embedding" in message and "vocab_size" in message
