"""`pipe import`: ONNX models written outside pipe become complete, verifiable, servable artifacts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.external_data_helper
import onnx.parser
import pytest
from click.testing import CliRunner

from pipeline.artifact.directory import Artifact
from pipeline.artifact.golden import load_golden
from pipeline.cli import main
from pipeline.export.metadata import read_metadata
from pipeline.runtime.session import create_session

W = np.array([[1.0, -1.0, 0.5], [0.5, 2.0, -1.0], [-1.5, 0.0, 1.0], [0.0, 1.0, 2.0]], dtype=np.float32)
B = np.array([0.1, -0.2, 0.3], dtype=np.float32)


def linear_model(opset: int = 18, body: str = "t = MatMul(x, W)\n y = Add(t, b)") -> onnx.ModelProto:
    """y = x @ W + b over a symbolic batch N, in ONNX's text syntax, as another framework might write it."""
    weights = ", ".join(str(float(v)) for v in W.reshape(-1))
    bias = ", ".join(str(float(v)) for v in B)
    text = f"""
    <ir_version: 8, opset_import: ["" : {opset}], producer_name: "handwritten">
    linear (float[N, 4] x) => (float[N, 3] y)
    <float[4, 3] W = {{{weights}}}, float[3] b = {{{bias}}}>
    {{
        {body}
    }}
    """
    model = onnx.parser.parse_model(text)
    onnx.checker.check_model(model)
    return model


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


def test_import_with_eval_data_gives_a_verified_servable_artifact(tmp_path: Path) -> None:
    source = tmp_path / "linear.onnx"
    onnx.save(linear_model(), source)
    x = np.random.default_rng(0).standard_normal((40, 4)).astype(np.float32)
    target = (x @ W + B).argmax(1)
    target[:4] = (target[:4] + 1) % 3  # a few wrong labels, so accuracy is a measured number, not 1.0
    np.savez(tmp_path / "eval.npz", x=x, target=target)
    repo = tmp_path / "artifacts"

    result = invoke(
        "import", str(source), "--name", "linear", "--eval-data", str(tmp_path / "eval.npz"),
        "--labels", "a,b,c", "--repository", str(repo),
    )  # fmt: skip
    assert result.exit_code == 0, result.output

    artifact = Artifact.load(repo / "linear" / "1")  # verifies every listed file's hash
    manifest = artifact.manifest
    assert manifest.lineage.backend == "import" and manifest.labels == ["a", "b", "c"]
    assert [(s.name, s.dtype, s.shape) for s in manifest.inputs] == [("x", "float32", ["N", 4])]
    assert [(s.name, s.shape) for s in manifest.outputs] == [("y", ["N", 3])]
    assert set(manifest.files) == {"model.onnx", "golden.npz"}
    assert manifest.metrics["accuracy"] == pytest.approx(36 / 40)
    assert manifest.stages.import_.producer == "handwritten" and manifest.stages.import_.parity["passed"]

    golden = load_golden(artifact)
    np.testing.assert_allclose(golden.outputs["y"], x @ W + B, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(golden.target, target)
    stamped = read_metadata(artifact.path("model.onnx"))
    assert stamped["pipe.identity_digest"] == manifest.identity_digest()
    assert stamped["pipe.labels"] == '["a", "b", "c"]'

    # Servable: the recorded file answers a request of any batch size with the right numbers.
    session = create_session(artifact.path("model.onnx"))
    for batch in (1, 5):
        (y,) = session.run(None, {"x": x[:batch]})
        np.testing.assert_allclose(y, x[:batch] @ W + B, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")  # torch.export internals
def test_import_of_a_torch_export_with_external_data_and_generated_inputs(tmp_path: Path) -> None:
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2)).eval()
    src = tmp_path / "elsewhere"
    src.mkdir()
    program = torch.onnx.export(
        net, (torch.zeros(2, 64),), input_names=["features"], output_names=["scores"],
        dynamo=True, dynamic_shapes=({0: "batch"},), verbose=False,
    )  # fmt: skip
    program.save(str(src / "net.onnx"), external_data=True)
    assert (src / "net.onnx.data").stat().st_size >= 64 * 32 * 4  # the big weight lives outside the graph

    repo = tmp_path / "artifacts"
    result = invoke("import", str(src / "net.onnx"), "--name", "net", "--task", "regression", "--repository", str(repo))
    assert result.exit_code == 0, result.output
    artifact = Artifact.load(repo / "net" / "1")
    assert set(artifact.manifest.files) == {"model.onnx", "net.onnx.data", "golden.npz"}
    assert artifact.manifest.stages.import_.golden == "generated"
    golden = load_golden(artifact)
    assert golden.inputs["features"].shape == (16, 64) and golden.inputs["features"].dtype == np.float32
    with torch.no_grad():
        expected = net(torch.from_numpy(golden.inputs["features"])).numpy()
    np.testing.assert_allclose(golden.outputs["scores"], expected, rtol=1e-5, atol=1e-5)


def external_weights(tmp_path: Path, location: str) -> Path:
    model = linear_model()
    weight = model.graph.initializer[0]
    weight.ClearField("float_data")
    weight.raw_data = W.tobytes()
    onnx.external_data_helper.set_external_data(weight, location=location)
    weight.data_location = onnx.TensorProto.EXTERNAL
    weight.ClearField("raw_data")
    path = tmp_path / "models" / "linear.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)
    return path


def test_weights_beside_an_imported_graph_are_hashed_and_counted_in_its_size(tmp_path: Path) -> None:
    path = external_weights(tmp_path, "weights.bin")
    (path.parent / "weights.bin").write_bytes(W.tobytes())
    repo = tmp_path / "artifacts"
    result = invoke("import", str(path), "--name", "linear", "--repository", str(repo))
    assert result.exit_code == 0, result.output
    artifact = Artifact.load(repo / "linear" / "1")  # verifies every listed file's hash
    files = artifact.manifest.files
    assert set(files) == {"model.onnx", "weights.bin", "golden.npz"}
    variant = artifact.manifest.variants["fp32"]
    assert (
        variant.size
        == files["model.onnx"].size + files["weights.bin"].size
        == artifact.path("model.onnx").stat().st_size + W.nbytes
    )


@pytest.mark.parametrize("location", ["../secrets.bin", "/etc/passwd"])
def test_external_data_escaping_the_model_directory_is_refused(tmp_path: Path, location: str) -> None:
    (tmp_path / "secrets.bin").write_bytes(W.tobytes())
    path = external_weights(tmp_path, location)
    repo = tmp_path / "artifacts"
    result = invoke("import", str(path), "--name", "linear", "--repository", str(repo))
    assert result.exit_code == 2
    assert f"external data location {location!r} escapes the model's directory" in result.output
    assert not (repo / "linear").exists() or not any((repo / "linear").iterdir())


def test_operator_missing_from_the_declared_opset_is_named(tmp_path: Path) -> None:
    # GridSample exists from opset 16; a file declaring 15 and using it is broken as written.
    body = "t = MatMul(x, W)\n y0 = Add(t, b)\n y = Identity(y0)\n img = Constant<value = float[1, 1, 2, 2] {1, 2, 3, 4}>()\n grid = Constant<value = float[1, 1, 1, 2] {0, 0}>()\n s = GridSample(img, grid)"  # noqa: E501
    model = onnx.parser.parse_model(
        f"""<ir_version: 8, opset_import: ["" : 15]>
        linear (float[N, 4] x) => (float[N, 3] y) <float[4, 3] W = {{{", ".join(["0.0"] * 12)}}}, float[3] b = {{0.0, 0.0, 0.0}}>
        {{ {body} }}"""  # noqa: E501
    )
    path = tmp_path / "old.onnx"
    onnx.save(model, path)
    result = invoke("import", str(path), "--name", "old", "--repository", str(tmp_path / "artifacts"))
    assert result.exit_code == 2
    assert "operator GridSample is not in ONNX opset 15; it first appears in opset 16" in result.output
    assert "re-export it at opset 16 or later" in result.output


def test_bad_inputs_are_refused_with_the_value_and_nothing_left_behind(tmp_path: Path) -> None:
    source = tmp_path / "linear.onnx"
    onnx.save(linear_model(), source)
    repo = tmp_path / "artifacts"
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x00\x01 not a protobuf \xff" * 10)
    np.savez(tmp_path / "wrong.npz", features=np.zeros((3, 4), np.float32))
    untyped = linear_model()
    untyped.graph.input[0].type.tensor_type.elem_type = onnx.TensorProto.UNDEFINED
    onnx.save(untyped, tmp_path / "untyped.onnx")
    np.savez(tmp_path / "empty.npz", x=np.zeros((0, 4), np.float32))
    np.savez(tmp_path / "scalar.npz", x=np.zeros((3, 4), np.float32), target=np.array(1))
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\nth\xe9\n".encode("latin-1"))
    graphs = {  # no inputs; a scalar input; a scalar output (labels cannot name its classes)
        "noinput": "g () => (float[3] y) { y = Constant <value_floats = [1.0, 2.0, 3.0]> () }",
        "scalar": "g (float x) => (float y) { y = Add(x, x) }",
        "sum": "g (float[N, 4] x) => (float y) { y = ReduceSum <keepdims = 0> (x) }",
    }
    for stem, graph in graphs.items():
        onnx.save(
            onnx.parser.parse_model(f'<ir_version: 8, opset_import: ["" : 18]> {graph}'), tmp_path / f"{stem}.onnx"
        )
    lying = linear_model()
    lying.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 5  # declares 5 classes, computes 3
    onnx.save(lying, tmp_path / "lying.onnx")
    cases = {
        ("import", str(garbage), "--name", "g"): "is not an ONNX model",
        ("import", str(tmp_path / "missing.onnx"), "--name", "g"): "not found",
        ("import", str(tmp_path / "untyped.onnx"), "--name", "g"): "'x' has element type 0, which has no numpy dtype",
        ("import", str(source), "--name", "Bad Name"): "name 'Bad Name' is not a safe directory name",
        ("import", str(source), "--name", "l", "--labels", "a,b"): "2 labels given (['a', 'b']) but output 'y' has 3",
        ("import", str(source), "--name", "l", "--labels", "a,,b"): "has an empty class name",
        ("import", str(source), "--name", "l", "--labels", "a,b,a"): "must be distinct; repeated: a",
        ("import", str(source), "--name", "l", "--labels-file", str(tmp_path / "latin1.txt")): "is not UTF-8 text",
        ("import", str(source), "--name", "l", "--labels", "a", "--labels-file", "x"): "not both",
        (
            "import",
            str(source),
            "--name",
            "l",
            "--eval-data",
            str(tmp_path / "wrong.npz"),
        ): "lacks arrays for model inputs ['x']",
        ("import", str(source), "--name", "l", "--eval-data", str(tmp_path / "empty.npz")): "holds no samples",
        ("import", str(source), "--name", "l", "--eval-data", str(tmp_path / "scalar.npz")): "'target' is a scalar",
        ("import", str(tmp_path / "noinput.onnx"), "--name", "c"): "has 0 graph inputs (initializers aside) and 1",
        ("import", str(tmp_path / "scalar.onnx"), "--name", "s"): "inputs ['x'] are scalars (rank 0)",
        ("import", str(tmp_path / "sum.onnx"), "--name", "s", "--labels", "a,b"): "output 'y' [] is not a classifier's",
    }
    for args, message in cases.items():
        result = invoke(*args, "--repository", str(repo))
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output, (args, result.output)
    # an output declaring 5 classes that computes 3 is taken as computed and said (issue 28), not refused
    result = invoke("import", str(tmp_path / "lying.onnx"), "--name", "s", "--labels", "a,b,c", "--repository",
                    str(tmp_path / "taken"))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "is declared ['N', 5] but computes [1, 3]: taken as computed, ['N', 3]" in result.output
    leftovers = [p for p in repo.rglob("*")] if repo.exists() else []
    assert not [p for p in leftovers if p.is_file()], leftovers
