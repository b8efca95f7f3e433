"""The models and artifacts the `pipe check` tests build inline: a linear classifier in ONNX's text syntax,
imported with labelled evaluation data, and baseline summaries written by hand."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
from click.testing import CliRunner, Result

from pipeline.artifact.tensors import TensorSpec
from pipeline.check.baseline import Baseline, VariantSummary
from pipeline.cli import main

W = np.array([[1.0, -1.0, 0.5], [0.5, 2.0, -1.0], [-1.5, 0.0, 1.0], [0.0, 1.0, 2.0]], dtype=np.float32)
B = np.array([0.1, -0.2, 0.3], dtype=np.float32)
FAST = ("--latency-seconds", "0.2")  # the latency check runs in every test; keep it short


def reports(tmp_path: Path) -> tuple[str, ...]:
    """The three reports, written into tmp_path for `regressions` to read back."""
    return (
        "--junit",
        str(tmp_path / "c.xml"),
        "--markdown",
        str(tmp_path / "c.md"),
        "--json",
        str(tmp_path / "c.json"),
    )


def regressions(output: str, tmp_path: Path) -> dict[str, str]:
    """Each failed check and its detail, asserted to be named the same in the terminal, the JUnit XML and the Markdown.

    The terminal shows it twice: in the table (`name  failed  detail`) and in the final error's list
    (`name: detail`).
    """
    checks = json.loads((tmp_path / "c.json").read_text())["checks"]
    failed = {c["name"]: c["detail"] for c in checks if c["status"] == "failed"}
    suite = ET.parse(tmp_path / "c.xml").getroot()
    junit = {case.get("name"): case.find("failure").get("message") for case in suite.iter("testcase")
             if case.find("failure") is not None}  # fmt: skip
    assert junit == failed and suite.get("failures") == str(len(failed))
    markdown = (tmp_path / "c.md").read_text()
    assert f"**{len(failed)} regression(s)**" in markdown
    for name, detail in failed.items():
        assert re.search(rf"^  {re.escape(name)} +failed +{re.escape(detail)}$", output, re.M), (name, output)
        assert f"  {name}: {detail}\n" in output, (name, output)
        assert f"| `{name}` | ❌ failed | {detail.replace('|', chr(92) + '|')} |" in markdown, (name, markdown)
    return failed


def linear(weights: np.ndarray = W, name: str = "x", dtype: str = "float", heavy: int = 0) -> onnx.ModelProto:
    """y = x @ W + b over a symbolic batch N, in ONNX's text syntax.

    `heavy` K > 0 adds a needless K x K MatMul whose result, times zero, is added to y: the outputs
    are the same bit for bit and the model is slower. It depends on the input (a broadcast of the
    input's sum), so onnxruntime cannot fold it into a constant.
    """
    w = ", ".join(str(float(v)) for v in weights.reshape(-1))
    b = ", ".join(str(float(v)) for v in B)
    cast = f"xf = Cast<to = 1>({name})" if dtype != "float" else f"xf = Identity({name})"
    extra = f", int64[2] square = {{{heavy}, {heavy}}}, float zero = {{0.0}}" if heavy else ""
    tail = (
        """
        s = ReduceSum<keepdims = 0>(xf)
        big = Expand(s, square)
        product = MatMul(big, big)
        total = ReduceSum<keepdims = 0>(product)
        nothing = Mul(total, zero)
        y = Add(y0, nothing)"""
        if heavy
        else "y = Identity(y0)"
    )
    text = f"""
    <ir_version: 8, opset_import: ["" : 18], producer_name: "handwritten">
    linear ({dtype}[N, 4] {name}) => (float[N, 3] y)
    <float[4, 3] W = {{{w}}}, float[3] b = {{{b}}}{extra}>
    {{
        {cast}
        t = MatMul(xf, W)
        y0 = Add(t, b)
        {tail}
    }}
    """
    model = onnx.parser.parse_model(text)
    onnx.checker.check_model(model)
    return model


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def imported(tmp_path: Path, model: onnx.ModelProto, name: str, input_name: str = "x", dtype=np.float32) -> Path:
    """`pipe import` of `model` with evaluation data labelled by the reference weights: a classifier with accuracy."""
    source = tmp_path / f"{name}.onnx"
    onnx.save(model, source)
    x = np.random.default_rng(0).standard_normal((60, 4)).astype(np.float32)
    target = (x @ W + B).argmax(1)
    np.savez(tmp_path / f"{name}.npz", **{input_name: x.astype(dtype), "target": target})
    repo = tmp_path / "artifacts"
    result = invoke(
        "import", str(source), "--name", name, "--eval-data", str(tmp_path / f"{name}.npz"),
        "--labels", "a,b,c", "--repository", str(repo),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return repo / name / "1"


def summary(**changes: object) -> Baseline:
    """A baseline summary written inline, for the checks that need no model."""
    fields: dict = {
        "name": "toy", "version": 1, "task": "classification", "labels": ["a", "b", "c"],
        "inputs": [TensorSpec("x", "float32", ["batch", 4])], "outputs": [TensorSpec("y", "float32", ["batch", 3])],
        "metrics": {"accuracy": 0.9}, "variants": {"fp32": VariantSummary(status="passed", precision="fp32")},
        "model_size": 1000, "created": "2026-01-01T00:00:00+00:00",
    }  # fmt: skip
    return Baseline(**{**fields, **changes})
