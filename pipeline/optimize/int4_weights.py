"""`int4-weights`: a decoder's MatMul weights (lm_head included, tied or not) stored in 4 bits by blocks.

The smallest decoder pipe makes (about 0.2x the size of model.onnx with block 32), and the one that
moves furthest from fp32: a real 135M instruct model kept 0.51 top-1 agreement (issue 29); the budget
judges it, and `--quantize auto` keeps it only within budget. The conversion and its settings are
weight_only.py's.
"""

from __future__ import annotations

from pipeline.optimize.weight_only import WeightOnly


class Int4Weights(WeightOnly):
    name, precision, choice, bits = "int4-weights", "int4", "int4-weights", 4


INT4_WEIGHTS = Int4Weights()
