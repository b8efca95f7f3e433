"""What a device program meets, checked without converting: a crashing runtime, fp16's range, the host line."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from pipeline.artifact.manifest import Manifest
from pipeline.artifact.tensors import TensorSpec
from pipeline.core.host import describe_host, host_line
from pipeline.edge.convert import Converted
from pipeline.edge.device import device_check, device_runtime, device_tolerance
from pipeline.edge.feeding import feeding_entry, write_feeding
from pipeline.edge.fp16range import fp16_range_rows
from pipeline.verify.budgets import MetricDrop
from pipeline.verify.policies import Exact

# tflite-runtime 2.14 on a model converted with free spatial dims: heap corruption, SIGABRT, no result line
ABORTS = """#!/bin/sh
echo "INFO: Created TensorFlow Lite XNNPACK delegate for CPU." >&2
echo "malloc(): unaligned tcache chunk detected" >&2
kill -ABRT $$
"""


def aborting_python(tmp_path: Path) -> Path:
    python = tmp_path / "python"
    python.write_text(ABORTS)
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    return python


def house(path: Path, mean: float = 206070.0) -> Path:
    """price = relu(x W1) W2 * 50,000 + mean: a regression head with the target's mean baked in."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(a, n) for a, n in [
        (rng.normal(size=(8, 16)).astype(np.float32) * 0.5, "w1"), (rng.normal(size=(16, 1)).astype(np.float32), "w2"),
        (np.array([50000.0], np.float32), "target_std"), (np.array([mean], np.float32), "target_mean")]]  # fmt: skip
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], "fc1"), helper.make_node("Relu", ["h"], ["r"], "relu"),
             helper.make_node("MatMul", ["r", "w2"], ["z"], "fc2"),
             helper.make_node("Mul", ["z", "target_std"], ["zs"], "unscale"),
             helper.make_node("Add", ["zs", "target_mean"], ["price"], "add_mean")]  # fmt: skip
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])
    price = helper.make_tensor_value_info("price", TensorProto.FLOAT, ["batch", 1])
    graph = helper.make_graph(nodes, "house", [x], [price], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    return path


def test_a_runtime_that_crashes_is_reported_with_its_signal_and_its_last_lines(tmp_path: Path) -> None:
    python = aborting_python(tmp_path)
    np.savez(tmp_path / "golden.npz", **{"in.x": np.ones((2, 8), np.float32), "out.y": np.ones((2, 1), np.float32)})
    (tmp_path / "model.fp32.tflite").write_bytes(b"TFL3")
    runtime = device_runtime(python)  # it dies before saying which runtime it is
    result = device_check(python, tmp_path / "model.fp32.tflite", tmp_path / "golden.npz", (1e-3, 1e-3), runtime)
    assert not result.ran and runtime == "tflite-runtime"
    assert result.detail.startswith("crashed (SIGABRT) running model.fp32.tflite; last output: ")
    assert result.detail.endswith("malloc(): unaligned tcache chunk detected")  # the last line, not the INFO banner
    (row,) = result.rows  # a row of the gate's failure table
    assert row.check == "device tflite-runtime" and not row.passed and "SIGABRT" in row.detail


def test_device_tolerance_keeps_the_policys_rtol_and_a_floor_on_atol() -> None:
    assert device_tolerance("fp32", Exact(1e-4, 1e-3)) == (1e-3, 1e-3)
    assert device_tolerance("fp16", MetricDrop(0.015)) is None  # lossy: judged by its budget on LiteRT
    assert device_tolerance("fp32", Exact(3e-3, 1e-3)) == (3e-3, 1e-3)  # a looser gate is kept
    assert device_tolerance("int8", MetricDrop(0.015)) is None  # lossy: it must run and give finite outputs


def test_fp16_range_names_the_baked_in_constant_first_then_the_activations(tmp_path: Path) -> None:
    model = house(tmp_path / "house.onnx")
    x = np.random.default_rng(1).normal(size=(32, 8)).astype(np.float32)
    rows = fp16_range_rows(model, {"x": x}, tmp_path)
    assert rows[0].output == "target_mean" and not rows[0].passed and rows[0].check == "fp16 range"
    assert "constant 'target_mean' (used by node 'add_mean') holds 206,070, past fp16's largest value 65,504" in (
        rows[0].detail)  # fmt: skip
    assert {r.output for r in rows[1:]} <= {"price", "zs"} and rows[1:], rows  # activations past 65,504
    assert all("activation" in r.detail for r in rows[1:])
    assert [r.output for r in fp16_range_rows(model, None, tmp_path)] == ["target_mean"]  # no samples: constants only
    assert fp16_range_rows(house(tmp_path / "small.onnx", mean=2.0), None, tmp_path) == []
    assert not list(tmp_path.glob("fp16-range*"))  # the probe model is removed


def test_the_host_line_names_the_cpu_and_says_nothing_for_an_empty_record() -> None:
    host = describe_host()
    assert host["cpus"] and host["cpu"] and host_line(host).startswith(host["cpu"])
    assert (
        host_line({"cpu": "AMD EPYC", "cpus": 2, "system": "Linux 6.8 x86_64"}) == "AMD EPYC (2 CPUs), Linux 6.8 x86_64"
    )
    assert host_line({}) == ""


def test_feeding_json_and_labels_txt_say_how_to_feed_an_int8_image_classifier(tmp_path: Path) -> None:
    image = {"mode": "L", "size": [8, 8], "resize": "bilinear", "scale": 16 / 255}
    spec = TensorSpec("input", "float32", ["batch", 1, 8, 8], layout="NCHW", preprocessing={"image": image})
    logits = TensorSpec("logits", "float32", ["batch", 3])
    manifest = Manifest("digits", 3, "classification", inputs=[spec], outputs=[logits], labels=["zero", "one", "two"])
    int8 = Converted("int8", tmp_path / "model.int8.tflite", "NHWC",
                     [{"name": "input", "dtype": "int8", "shape": [-1, 8, 8, 1], "scale": 0.0627, "zero_point": -128}],
                     [{"name": "logits", "dtype": "int8", "shape": [-1, 3], "scale": 0.1, "zero_point": 5}],
                     names={"logits": "output_0"})  # fmt: skip
    entry = feeding_entry("tflite-int8", int8, manifest)
    written = write_feeding(tmp_path / "edge", manifest, {"model.int8.tflite": entry})
    assert written == ["edge/feeding.json", "edge/labels.txt"]
    assert (tmp_path / "edge" / "labels.txt").read_text() == "zero\none\ntwo\n"  # index order, one a line
    document = json.loads((tmp_path / "edge" / "feeding.json").read_text())
    assert document["labels"] == "labels.txt" and document["task"] == "classification"
    fed = document["models"]["model.int8.tflite"]
    assert fed["layout"] == "NHWC" and fed["names"] == {"logits": "output_0"}
    (x,) = fed["inputs"]
    assert x == {"name": "input", "tensor": "input", "dtype": "int8", "shape": [-1, 8, 8, 1], "scale": 0.0627,
                 "zero_point": -128, "layout": "NHWC", "preprocessing": {"image": image}}  # fmt: skip
    assert fed["outputs"][0]["tensor"] == "output_0" and fed["outputs"][0]["zero_point"] == 5
