"""Runners: onnxruntime and torch behind one call shape, chunked runs, and no heavy imports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.artifact.tensors import TensorSpec
from pipeline.core.arrays import Arrays
from pipeline.core.errors import InputError
from pipeline.runtime.runners import ort_runner, run_chunked, torch_runner
from pipeline.runtime.session import create_session
from tests.verify.verify_models import graph, inputs, linear, weights


def test_ort_runner_from_a_file_or_a_held_session_gives_named_outputs(tmp_path: Path) -> None:
    w = weights(3)
    path = linear(tmp_path, w)
    x = inputs(5)
    from_file = ort_runner(path)
    from_session = ort_runner(create_session(path))
    assert from_file.providers == ["CPUExecutionProvider"]
    for run in (from_file, from_session):
        ((name, y),) = run(x).items()
        assert name == "y"
        np.testing.assert_allclose(y, x["x"] @ w, rtol=1e-6)


def test_run_chunked_calls_in_chunks_and_concatenates(tmp_path: Path) -> None:
    run = ort_runner(graph(tmp_path, "y = Neg(x)"))
    sizes: list[int] = []

    def counted(arrays: Arrays) -> Arrays:
        sizes.append(len(arrays["x"]))
        return {**run(arrays), "twice": 2 * arrays["x"]}

    x = inputs(10)
    out = run_chunked(counted, x, chunk=4)
    assert sizes == [4, 4, 2] and sorted(out) == ["twice", "y"]
    np.testing.assert_array_equal(out["y"], -x["x"])
    assert list(run_chunked(counted, x, names=["y"])) == ["y"]
    empty = run_chunked(counted, {"x": x["x"][:0]})
    assert empty["y"].shape == (0, 4)
    with pytest.raises(InputError, match="chunk is 0"):
        run_chunked(counted, x, chunk=0)


def test_torch_runner_is_named_numpy_in_and_out() -> None:
    import torch

    torch.manual_seed(0)
    module = torch.nn.Linear(4, 3)
    x = inputs(5)
    run = torch_runner(module, [TensorSpec("x", "float32", ["batch", 4])], [TensorSpec("y", "float32", ["batch", 3])])
    out = run(x)
    assert list(out) == ["y"] and out["y"].dtype == np.float32
    np.testing.assert_allclose(out["y"], module(torch.from_numpy(x["x"])).detach().numpy(), rtol=1e-6)
    two = [TensorSpec("y", "float32", ["batch", 3]), TensorSpec("z", "float32", ["batch", 3])]
    with pytest.raises(InputError, match="the module returned 1 outputs, the manifest lists 2"):
        torch_runner(module, [TensorSpec("x", "float32", ["batch", 4])], two)(x)


CHECK = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted(sys.modules)))
"""
VERIFY = ("metrics", "policies", "report", "gate")
SHARED = ("runtime.session", "runtime.runners", "samples.evaluation", "samples.calibration")
MODULES = [f"pipeline.verify.{m}" for m in VERIFY] + [f"pipeline.{m}" for m in SHARED]


def test_the_verifier_imports_no_heavy_framework_and_no_stage() -> None:
    proc = subprocess.run([sys.executable, "-c", CHECK, *MODULES], capture_output=True, text=True, check=True)
    loaded = set(json.loads(proc.stdout))
    heavy = loaded & {"torch", "tensorflow", "onnx2tf", "keras"}
    stage_names = ("train", "export", "optimize", "edge", "check", "benchmark", "report", "serve", "predict")
    stages = {m for m in loaded if m.split(".")[:2] in (["pipeline", s] for s in stage_names)}
    assert not heavy and not stages, f"imports {sorted(heavy | stages)}"
