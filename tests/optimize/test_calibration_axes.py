"""Static int8 calibration of a model whose samples are not on axis 0 (`pipe.sample_axes`).

Before, calibration_feed sliced pipe's sample-leading arrays along axis 0 and fed them as they were:
a state tensor [2, batch, 3] (Silero VAD's [2, batch, 128] in small) had its fixed dim 2 read as the
model's batch, so calibration ran 2 samples a pass with the samples fed on the layer axis (calibrated
on the wrong values, and 4 of 5 samples). Now each batch is moved to the tensor's batch axis, as the
import stamped it, and the batch is read on that axis. Silero's own static int8 fails earlier, at the
checker (an If branch's nodes out of order after QDQ), so the model here is a look-alike.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pipeline.optimize.calibration_feed import sample_reader
from pipeline.optimize.int8_static import INT8_STATIC
from pipeline.optimize.quantize import QuantSettings
from pipeline.runtime.sample_axes import METADATA_KEY, SampleAxes
from pipeline.runtime.session import create_session

SAMPLES = 5


@pytest.fixture(scope="module")
def stateful(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """x [batch, 4] -> y = x @ W [batch, 3]; state [2, batch, 3] -> stateN = state @ V, its batch on axis 1."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.normal(size=s).astype(np.float32), n) for n, s in (("W", (4, 3)), ("V", (3, 3)))
    ]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"]), helper.make_node("MatMul", ["state", "V"], ["stateN"])],
        "stateful",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, "batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3]),
         helper.make_tensor_value_info("stateN", TensorProto.FLOAT, [2, "batch", 3])],
        weights,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    stamp = SampleAxes({"state": 1}, {"stateN": 1}).metadata()
    model.metadata_props.add(key=METADATA_KEY, value=stamp)
    path = tmp_path_factory.mktemp("axes") / "stateful.onnx"
    onnx.save(model, str(path))
    return path


def _samples() -> dict[str, np.ndarray]:
    """Sample-leading, as pipe holds them: x [5, 4], state [5, 2, 3] (sample i's state all i: told apart)."""
    state = np.broadcast_to(np.arange(SAMPLES, dtype=np.float32)[:, None, None], (SAMPLES, 2, 3)).copy()
    return {"x": np.random.default_rng(1).normal(size=(SAMPLES, 4)).astype(np.float32), "state": state}


def test_calibration_batches_are_fed_on_each_inputs_batch_axis(stateful: Path) -> None:
    warnings: list[str] = []
    reader = sample_reader(onnx.load(str(stateful)), _samples(), SAMPLES, None, warnings)
    assert reader.batch == 16 and reader.samples == SAMPLES and not warnings  # not the layer dim 2 as the batch
    batch = reader.get_next()
    assert batch is not None and batch["state"].shape == (2, SAMPLES, 3)
    np.testing.assert_array_equal(batch["state"][:, 3], np.full((2, 3), 3.0))  # sample 3 on the batch axis
    assert reader.get_next() is None


def test_static_int8_calibrates_every_sample_in_the_models_layout(stateful: Path, tmp_path: Path) -> None:
    out = tmp_path / "int8.onnx"
    report = INT8_STATIC.quantize(stateful, out, QuantSettings("static"), _samples(), scratch=tmp_path / "scratch")
    assert report.calibration_samples == SAMPLES
    samples = _samples()
    feed = {"x": samples["x"], "state": np.moveaxis(samples["state"], 0, 1)}
    want = create_session(stateful).run(None, feed)
    got = create_session(out).run(None, feed)
    for w, g in zip(want, got, strict=True):
        assert np.abs(w - g).max() <= 0.05 * np.abs(w).max()  # the state's range (0..4) calibrated, not 0..1
