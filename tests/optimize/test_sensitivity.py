"""Node sensitivity: the error each quantized node adds, measured channel by channel."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.optimize.quantize import QuantSettings
from pipeline.optimize.quantizers import quantize
from pipeline.optimize.sensitivity import sensitivity
from tests.optimize.transform_models import wide_channel_mlp


def test_a_layer_whose_one_wide_output_channel_ruins_the_others_is_scored_high(tmp_path: Path) -> None:
    """The hidden layer's weights give output channel 0 a range 3000x the rest: one int8 scale per tensor rounds every
    other channel away. Over the whole tensor that error hides under channel 0's size; per channel it shows.
    """
    rng = np.random.default_rng(0)
    src, dst = tmp_path / "wide.onnx", tmp_path / "int8.onnx"
    wide_channel_mlp(src, rng, outputs=8, wide=3000.0)
    quantize(src, dst, QuantSettings("dynamic", preprocess=False), scratch=tmp_path / "scratch")
    inputs = {"x": rng.standard_normal((64, 16)).astype(np.float32)}
    (tmp_path / "sensitivity").mkdir()
    scores = {s.node: s for s in sensitivity(src, dst, inputs, tmp_path / "sensitivity")}
    assert scores["hidden"].output_error > 0.2, scores["hidden"]  # the 31 narrow channels are mostly rounding noise
