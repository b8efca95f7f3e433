"""`int8-weights`: a decoder's MatMul weights (lm_head included, tied or not) stored in 8 bits by blocks.

The kind for a decoder that must stay close to fp32: about 0.3x the size of model.onnx and, on a Llama
trained here, next-token agreement with fp32 above 0.99 (docs/language-models.md). The conversion and
its settings are weight_only.py's.
"""

from __future__ import annotations

from pipeline.optimize.weight_only import WeightOnly


class Int8Weights(WeightOnly):
    name, precision, choice, bits = "int8-weights", "int8", "int8-weights", 8


INT8_WEIGHTS = Int8Weights()
