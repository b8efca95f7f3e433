"""A model whose weights are external data through `pipe optimize` and `pipe serve`: the path a model past
2 GB takes (its weights cannot be in the graph's protobuf), taken here by a small MLP saved the same way.

Before this, `pipe optimize` of an imported 2.2 GB MLP exited 3: onnxruntime's optimized copy pointed at the
source's data file from another directory (`... big.onnx.data, but it is not regular file`). Every variant is
now written as `<file>` + `<file>.data`, both hashed in the manifest, a changed byte of the data refused, and
the server loads the variant from its path.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from pipeline.artifact.directory import Artifact
from pipeline.cli import main
from pipeline.core.errors import ArtifactError
from pipeline.runtime.external_data import copy_model, graph_only, model_bytes, model_files, move_model, save_beside
from tests.serve.serve_process import start_server

KINDS = ["dynamic", "fp16", "auto"]


def mlp_with_external_data(directory: Path) -> Path:
    """x [batch, 32] -> MatMul 32x128 -> Relu -> MatMul 128x10, every weight in `big.onnx.data`."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((32, 128)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((128, 10)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])],
        [w1, w2],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    directory.mkdir(parents=True)
    path = directory / "big.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="big.onnx.data", size_threshold=0)
    return path


@pytest.fixture(scope="module")
def optimized(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The MLP imported (no --eval-data: generated inputs) and optimized: opt, int8-dynamic, fp16 and auto's int8."""
    tmp = tmp_path_factory.mktemp("external")
    source = mlp_with_external_data(tmp / "src")
    runner = CliRunner()
    result = runner.invoke(main, ["import", str(source), "--name", "big", "--repository", str(tmp / "artifacts")])
    assert result.exit_code == 0, result.output
    root = tmp / "artifacts" / "big" / "1"
    args = ["optimize", str(root), "--search-seconds", "10"] + [a for kind in KINDS for a in ("--quantize", kind)]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output  # was exit 3: the optimized copy's data "is not regular file"
    return root


def test_every_variant_keeps_its_weights_beside_it_and_both_are_hashed(optimized: Path) -> None:
    manifest = Artifact.load(optimized).manifest  # verified: every listed file hashes as recorded
    assert set(manifest.variants) == {"fp32", "opt", "int8-dynamic", "fp16", "int8"}
    for name, variant in manifest.variants.items():
        path = optimized / variant.file
        data = [f.relative_to(optimized).as_posix() for f in model_files(path)[:-1]]
        assert data, f"{name}: its weights went back into the graph"
        if name != "fp32":  # the import keeps the source's name (big.onnx.data); a variant's is <file>.data
            assert data == [f"{variant.file}.data"]
        for rel in [variant.file, *data]:
            assert rel in manifest.files, f"{rel} is not hashed in the manifest"
        assert variant.size == model_bytes(path) == sum(manifest.files[r].size for r in [variant.file, *data])
        tensors = graph_only(path).graph.initializer
        assert all(t.data_location == TensorProto.EXTERNAL for t in tensors if t.name in ("w1", "w2"))
    sizes = {name: v.size for name, v in manifest.variants.items()}
    assert sizes["int8-dynamic"] < 0.4 * sizes["fp32"] and sizes["fp16"] < 0.6 * sizes["fp32"]
    report = json.loads((optimized / "reports" / "optimize.json").read_text())
    assert report["fp32"]["size"] == sizes["fp32"]  # model.onnx with its data, not the 500-byte graph alone


def test_the_variants_compute_what_model_onnx_computes(optimized: Path) -> None:
    x = np.random.default_rng(1).standard_normal((4, 32)).astype(np.float32)

    def run(rel: str) -> np.ndarray:
        session = ort.InferenceSession(str(optimized / rel), providers=["CPUExecutionProvider"])
        return session.run(None, {"x": x})[0]

    want = run("model.onnx")
    np.testing.assert_allclose(run("variants/model.opt.onnx"), want, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(run("variants/model.fp16.onnx"), want, rtol=1e-2, atol=0.1)
    scale = float(np.abs(want).max())
    assert float(np.abs(run("variants/model.int8-dynamic.onnx") - want).max()) < 0.05 * scale


def test_a_changed_byte_of_a_variants_external_data_is_refused(optimized: Path, tmp_path: Path) -> None:
    copy = tmp_path / "big" / "1"
    shutil.copytree(optimized, copy)
    data = copy / "variants" / "model.int8-dynamic.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[100] ^= 1
    data.write_bytes(bytes(raw))
    with pytest.raises(ArtifactError, match=r"variants/model\.int8-dynamic\.onnx\.data: sha256 does not match"):
        Artifact.load(copy)


def test_optimize_again_removes_the_data_of_variants_it_no_longer_makes(optimized: Path, tmp_path: Path) -> None:
    copy = tmp_path / "big" / "1"
    shutil.copytree(optimized, copy)
    result = CliRunner().invoke(main, ["optimize", str(copy), "--graph", "none", "--quantize", "fp16"])
    assert result.exit_code == 0, result.output
    manifest = Artifact.load(copy).manifest
    assert sorted(f.name for f in (copy / "variants").iterdir()) == ["model.fp16.onnx", "model.fp16.onnx.data"]
    assert not [rel for rel in manifest.files if rel.startswith("variants/") and "fp16" not in rel]


def test_pipe_serve_loads_a_variant_with_external_data(optimized: Path, tmp_path: Path) -> None:
    server = start_server([optimized.parent.parent], tmp_path / "serve.log", "--variant", "int8-dynamic")
    try:
        x = np.random.default_rng(2).standard_normal((2, 32)).astype(np.float32)
        body = {"inputs": [{"name": "x", "shape": [2, 32], "datatype": "FP32", "data": x.ravel().tolist()}]}
        answer = httpx.post(f"{server.url}/v2/models/big/infer", json=body, timeout=30)
        assert answer.status_code == 200, answer.text
        got = np.array(answer.json()["outputs"][0]["data"], dtype=np.float32).reshape(2, 10)
    finally:
        server.stop()
    session = ort.InferenceSession(str(optimized / "variants" / "model.int8-dynamic.onnx"))
    np.testing.assert_allclose(got, session.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_moving_copying_and_linking_a_model_keeps_its_weights_readable(tmp_path: Path) -> None:
    """The three ways a stage places a model with external data, each its data renamed `<file>.data`."""
    source = mlp_with_external_data(tmp_path / "src")
    x = np.ones((1, 32), np.float32)
    want = ort.InferenceSession(str(source)).run(None, {"x": x})[0]
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    save_beside(graph_only(source), source.parent, scratch / "named.onnx")  # a graph-only proto, its data copied
    copy_model(scratch / "named.onnx", scratch / "copy.onnx")
    move_model(scratch / "copy.onnx", tmp_path / "moved.onnx")
    assert not (scratch / "copy.onnx").exists() and not (scratch / "copy.onnx.data").exists()
    for path in (scratch / "named.onnx", tmp_path / "moved.onnx"):
        assert [f.name for f in model_files(path)] == [f"{path.name}.data", path.name]
        onnx.checker.check_model(str(path))
        np.testing.assert_array_equal(ort.InferenceSession(str(path)).run(None, {"x": x})[0], want)
    assert (source.parent / "big.onnx.data").stat().st_nlink == 1  # copied, never linked: onnx refuses links
