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


def switched(tmp_path: Path) -> Path:
    """y = x @ w (w in a file beside the model) then, by an If on `flag` (an input with a default, False): y + 1
    when True, y - 1 otherwise."""
    from onnx import TensorProto, helper, numpy_helper

    one = numpy_helper.from_array(np.array(1, np.float32), "one")
    branch = {
        kind: helper.make_graph([helper.make_node(op, ["y", "one"], [f"{kind}_z"])], kind, [],
                                [helper.make_tensor_value_info(f"{kind}_z", TensorProto.FLOAT, None)])
        for kind, op in (("then", "Add"), ("else", "Sub"))
    }  # fmt: skip
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]),
         helper.make_node("If", ["flag"], ["z"], then_branch=branch["then"], else_branch=branch["else"])],
        "switched",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2]),
         helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 2])],
        [numpy_helper.from_array(np.eye(2, dtype=np.float32) * 3, "w"), one,
         numpy_helper.from_array(np.array(False), "flag")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    path = tmp_path / "model.onnx"
    onnx.save(model, path, save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    return path


def test_constants_fix_an_input_with_a_default_and_fold_the_if_on_it(tmp_path: Path) -> None:
    """pipe serve's session of a written decoder (`decode_in_place` a constant): the input is gone, the branch
    it chose is the graph's, the weights beside the file still load, and the session says what was fixed."""
    from pipeline.runtime.session import constants_of

    path = switched(tmp_path)
    x = np.array([[1, 2]], np.float32)
    plain = create_session(path, "cpu", 1, 1, False)
    assert plain.run(None, {"x": x})[0].tolist() == [[2, 5]]  # the default: y - 1
    assert plain.run(None, {"x": x, "flag": np.array(True)})[0].tolist() == [[4, 7]]
    assert constants_of(plain) == set()
    seen = tmp_path / "optimized"
    seen.mkdir()
    fixed = create_session(path, "cpu", 1, 1, False, seen, constants={"flag": np.array(True), "x": np.ones(2), "w": 0})
    assert constants_of(fixed) == {"flag"}  # x has no default, w is no input: neither is touched
    optimized = onnx.load(seen / "optimized.onnx", load_external_data=False)
    assert [n.op_type for n in optimized.graph.node] == ["MatMul", "Add"]  # the If folded
    assert [i.name for i in fixed.get_inputs()] == ["x"] and fixed.get_overridable_initializers() == []
    assert fixed.run(None, {"x": x})[0].tolist() == [[4, 7]]
    with pytest.raises(Exception, match="flag"):
        fixed.run(None, {"x": x, "flag": np.array(False)})
    untouched = create_session(path, "cpu", 1, 1, False, constants={"other": np.array(True)})
    assert constants_of(untouched) == set() and untouched.get_overridable_initializers()[0].name == "flag"


def test_constants_of_a_file_onnx_cannot_read_is_an_artifact_error(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"not a model")
    with pytest.raises(ArtifactError, match="onnx cannot read the model"):
        create_session(path, "cpu", constants={"flag": np.array(True)})
