"""One name for where versions go: `--repository` on train, run and import; `--out` kept as its alias."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from pipeline.cli import main


@pytest.mark.parametrize("command", ["train", "run", "import"])
def test_help_names_repository_with_out_as_its_alias(command: str) -> None:
    result = CliRunner().invoke(main, [command, "--help"])
    assert result.exit_code == 0 and "--repository, --out PATH" in result.output, result.output


def test_train_and_import_take_either_name(tmp_path: Path) -> None:
    recipe = {"name": "iris", "model": {"arch": "mlp", "hidden": [8]}, "data": {"source": "iris"},
              "train": {"epochs": 1}}  # fmt: skip
    (tmp_path / "iris.yaml").write_text(json.dumps(recipe))
    result = CliRunner().invoke(main, ["train", str(tmp_path / "iris.yaml"), "--repository", str(tmp_path / "a"),
                                       "--quiet"])  # fmt: skip
    assert result.exit_code == 0 and (tmp_path / "a" / "iris" / "1" / "manifest.json").is_file(), result.output

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])
    w = numpy_helper.from_array(np.full((4, 3), 0.1, np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x], [y], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9), tmp_path / "m.onnx")
    for flag, folder in (("--out", "b"), ("--repository", "c")):
        result = CliRunner().invoke(main, ["import", str(tmp_path / "m.onnx"), "--name", "lin", flag,
                                           str(tmp_path / folder)])  # fmt: skip
        assert result.exit_code == 0 and (tmp_path / folder / "lin" / "1" / "manifest.json").is_file(), result.output
