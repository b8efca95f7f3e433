"""An artifact made by `pipe import` is served by `pipe serve` and answers tritonclient with its golden numbers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest
import tritonclient.http as triton
from click.testing import CliRunner
from serve_process import start_server

from pipeline.artifact import Artifact
from pipeline.cli import main
from pipeline.golden import load_golden
from tests.conftest import LINEAR

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
