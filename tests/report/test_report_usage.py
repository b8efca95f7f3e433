"""The card's serve commands, run as written: the request they send must be one the model accepts."""

from __future__ import annotations

import base64
import json
import re
import subprocess
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


HOSTILE = "x'; touch PWNED; echo '"


def test_the_cards_command_lines_quote_a_hostile_input_name(tmp_path: Path) -> None:
    """Pasted into a real shell, every command line of the card runs its own program with the name intact."""
    model = onnx.parser.parse_model(
        FIXED.replace("float[4, 2] x,", "float[4, 2] hostile,").replace("MatMul(x,", "MatMul(hostile,")
    )
    model.graph.input[0].name = HOSTILE
    model.graph.node[0].input[0] = HOSTILE
    onnx.save(model, tmp_path / "hostile.onnx")
    repo = tmp_path / "artifacts"
    assert invoke("import", tmp_path / "hostile.onnx", "--name", "hostile", "--repository", repo).exit_code == 0
    assert invoke("report", repo / "hostile" / "1").exit_code == 0
    card = (repo / "hostile" / "1" / "reports" / "model-card.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", card, re.DOTALL)
    script = "\n".join(blocks)
    assert HOSTILE in card and "curl" in script

    assert subprocess.run(["sh", "-n", "-c", script], capture_output=True).returncode == 0
    stubs = tmp_path / "bin"  # every program the card names, recording its arguments instead of running
    stubs.mkdir()
    for program in ("curl", "python", "pipe", "scp", "pip"):
        (stubs / program).write_text(f'#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done >> {tmp_path}/argv\n')
        (stubs / program).chmod(0o755)
    work = tmp_path / "shell"
    work.mkdir()
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "HOME": str(tmp_path)}
    ran = subprocess.run(["sh", "-c", script], cwd=work, env=env, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    assert not list(tmp_path.rglob("PWNED"))
    argv = (tmp_path / "argv").read_text()
    assert json.loads(next(a for a in argv.splitlines() if a.startswith('{"inputs"')))["inputs"][0]["name"] == HOSTILE


def test_a_tensor_name_that_cannot_be_one_line_is_refused_at_import(tmp_path: Path) -> None:
    model = onnx.parser.parse_model(FIXED)
    model.graph.input[0].name = "x\nrm -rf ~"
    model.graph.node[0].input[0] = "x\nrm -rf ~"
    onnx.save(model, tmp_path / "newline.onnx")
    result = invoke("import", tmp_path / "newline.onnx", "--name", "n", "--repository", tmp_path / "artifacts")
    assert result.exit_code == 2 and "names are one line of printable text" in result.output, result.output


def test_a_detectors_card_shows_how_to_ask_for_boxes(tmp_path: Path) -> None:
    from PIL import Image

    from tests.export.real_models import yolo_detector

    yolo_detector(tmp_path / "yolo.onnx")
    result = invoke("import", tmp_path / "yolo.onnx", "--name", "yolo", "--repository", tmp_path / "artifacts")
    assert result.exit_code == 0, result.output
    section = "\n".join(serve_section(Artifact.load(tmp_path / "artifacts" / "yolo" / "1")))
    assert "add `detections` for its boxes, scores and labels in the picture's pixels" in section
    assert "confidence > 0.25, NMS IoU 0.7, at most 300 boxes per picture" in section
    program = next(line for line in section.splitlines() if line.startswith("python -c") and "b64" in line)
    Image.new("RGB", (40, 30), (200, 10, 10)).save(tmp_path / "photo.jpg")
    subprocess.run(program, shell=True, check=True, cwd=tmp_path)  # the card's own line, as a user runs it
    request = json.loads((tmp_path / "request.json").read_text())
    assert request["detections"] is True and len(request["instances"]) == 1
    assert base64.b64decode(request["instances"][0]["b64"]) == (tmp_path / "photo.jpg").read_bytes()
    assert "curl -s http://127.0.0.1:8000/v1/models/yolo/versions/1:predict -d @request.json" in section
