"""An artifact made by `pipe import` is served by `pipe serve` and answers tritonclient with its golden numbers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest
import tritonclient.http as triton
from click.testing import CliRunner

from pipeline.artifact.directory import Artifact
from pipeline.artifact.golden import load_golden
from pipeline.cli import main
from pipeline.runtime.session import create_session
from tests.conftest import LINEAR
from tests.serve.serve_process import start_server

pytestmark = pytest.mark.slow  # starts a server process


def test_imported_artifact_is_served_to_a_triton_client(tmp_path: Path) -> None:
    source = tmp_path / "linear.onnx"
    onnx.save(onnx.parser.parse_model(LINEAR), source)
    repo = tmp_path / "artifacts"
    args = ["import", str(source), "--name", "linear", "--labels", "a,b,c", "--repository", str(repo)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    golden = load_golden(Artifact.load(repo / "linear" / "1"))

    server = start_server([repo], tmp_path / "serve.log", "--poll", "0")
    try:
        with triton.InferenceServerClient(server.address) as client:
            x = golden.inputs["x"][:5]
            request = triton.InferInput("x", list(x.shape), "FP32")
            request.set_data_from_numpy(x)
            response = client.infer("linear", [request])
        np.testing.assert_allclose(response.as_numpy("y"), golden.outputs["y"][:5], rtol=1e-6, atol=1e-6)
    finally:
        server.stop()


def test_paddle_convention_import_is_served_at_any_batch_and_size(tmp_path: Path) -> None:
    """A batch written as -1 and height and width both '?': served at sizes the golden inputs never had."""
    from tests.export.test_import_dims import conv_classifier

    source = tmp_path / "paddle.onnx"
    onnx.save(conv_classifier([-1, 3, "?", "?"], [-1, 5]), source)
    repo = tmp_path / "artifacts"
    result = CliRunner().invoke(main, ["import", str(source), "--name", "paddle", "--repository", str(repo)])
    assert result.exit_code == 0, result.output

    reference = create_session(source)  # the file as paddle2onnx wrote it
    server = start_server([repo], tmp_path / "serve.log", "--poll", "0")
    try:
        with triton.InferenceServerClient(server.address) as client:
            for shape in ([1, 3, 32, 32], [3, 3, 40, 72]):  # height and width differ: two dims, not one
                x = np.random.default_rng(shape[0]).standard_normal(shape).astype(np.float32)
                request = triton.InferInput("x", shape, "FP32")
                request.set_data_from_numpy(x)
                response = client.infer("paddle", [request])
                (want,) = reference.run(None, {"x": x})
                np.testing.assert_allclose(response.as_numpy("y"), want, rtol=1e-5, atol=1e-5)
    finally:
        server.stop()
