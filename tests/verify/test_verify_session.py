"""The one onnxruntime session factory: providers, threads, and load failures as ArtifactError."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort
import pytest

from pipeline.core.errors import ArtifactError, InputError
from pipeline.runtime.session import create_session, providers_for


def relu(tmp_path: Path) -> Path:
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[N, 4] x) => (float[N, 4] y) { y = Relu(x) }""")
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    return path


def test_cpu_session_runs_and_reports_its_provider(tmp_path: Path) -> None:
    session = create_session(relu(tmp_path), "cpu", intra_op_threads=1, inter_op_threads=1, spin=False)
    assert session.get_providers() == ["CPUExecutionProvider"]
    (y,) = session.run(None, {"x": np.array([[-1, 2, -3, 4]], np.float32)})
    assert y.tolist() == [[0, 2, 0, 4]]


def test_auto_asks_for_cuda_exactly_when_onnxruntime_lists_it() -> None:
    listed = "CUDAExecutionProvider" in ort.get_available_providers()
    assert providers_for("auto")[0] == ("CUDAExecutionProvider" if listed else "CPUExecutionProvider")
    assert providers_for("auto")[-1] == providers_for("cpu")[0] == "CPUExecutionProvider"


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="onnxruntime-gpu installed")
def test_cuda_without_onnxruntime_gpu_is_refused_with_the_fix() -> None:
    with pytest.raises(ArtifactError, match=r"onnxruntime-gpu \(make GPU=1\)"):
        providers_for("cuda")


def test_unknown_provider_and_negative_threads_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="'gpu' is not one of auto, cpu, cuda"):
        providers_for("gpu")
    with pytest.raises(InputError, match="intra_op_threads is -1"):
        create_session(relu(tmp_path), intra_op_threads=-1)


def test_a_file_onnxruntime_cannot_load_is_an_artifact_error_on_one_line(tmp_path: Path) -> None:
    broken = tmp_path / "model.onnx"
    broken.write_bytes(relu(tmp_path).read_bytes()[:-7])  # truncated
    with pytest.raises(ArtifactError, match="onnxruntime cannot load the model") as caught:
        create_session(broken)
    assert "\n" not in str(caught.value)
    with pytest.raises(ArtifactError, match="NO_SUCHFILE"):
        create_session(tmp_path / "absent.onnx")
