"""The card's serve commands, run as written: the request they send must be one the model accepts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort

from pipeline.artifact.datatypes import V2_TO_NUMPY
from pipeline.artifact.directory import Artifact
from pipeline.report.usage import serve_section
from tests.report.conftest import invoke

# Two inputs, one of them int64 tokens, and a batch fixed at 4 (as many exported models have).
FIXED = """
<ir_version: 8, opset_import: ["" : 18]>
fixed (float[4, 2] x, int64[4, 3] ids) => (float[4, 2] y)
<float[2, 2] W = {1.0, -1.0, 0.5, 2.0}>
{
    t = MatMul(x, W)
    s = ReduceSum(ids)
    f = Cast<to=1>(s)
    y = Add(t, f)
}
"""


def test_the_requests_of_a_fixed_batch_model_with_two_inputs_are_ones_it_accepts(tmp_path: Path) -> None:
    onnx.save(onnx.parser.parse_model(FIXED), tmp_path / "fixed.onnx")
    result = invoke("import", tmp_path / "fixed.onnx", "--name", "fixed", "--repository", tmp_path / "artifacts")
    assert result.exit_code == 0, result.output
    artifact = Artifact.load(tmp_path / "artifacts" / "fixed" / "1")
    section = "\n".join(serve_section(artifact))

    v2 = json.loads(re.search(r"-d '(\{\"inputs\".*\})'$", section, re.MULTILINE).group(1))
    feeds = {t["name"]: np.array(t["data"], V2_TO_NUMPY[t["datatype"]]).reshape(t["shape"]) for t in v2["inputs"]}
    assert {name: a.shape for name, a in feeds.items()} == {"x": (4, 2), "ids": (4, 3)}
    session = ort.InferenceSession(artifact.path("model.onnx"), providers=["CPUExecutionProvider"])
    assert session.run(None, feeds)[0].shape == (4, 2)

    instances = json.loads(re.search(r"-d '(\{\"instances\".*\})'$", section, re.MULTILINE).group(1))["instances"]
    assert len(instances) == 4 and all(set(row) == {"x", "ids"} for row in instances)
    assert "the batch axis is 4 here" in section
