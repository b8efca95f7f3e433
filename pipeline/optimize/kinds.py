"""The variant kinds `pipe optimize` can make, in the order it makes them: a new kind is one module and one line.

Each kind (kind.py) holds its variant's name and precision, what asks for it, what it needs, its
settings and how it makes its file; the stage loops over this list (stage.py).
"""

from __future__ import annotations

from pipeline.optimize.fp16 import FP16
from pipeline.optimize.int4_weights import INT4_WEIGHTS
from pipeline.optimize.int8_auto import INT8_AUTO
from pipeline.optimize.int8_dynamic import INT8_DYNAMIC
from pipeline.optimize.int8_static import INT8_STATIC
from pipeline.optimize.int8_weights import INT8_WEIGHTS
from pipeline.optimize.kind import Kind
from pipeline.optimize.opt import OPT

KINDS: list[Kind] = [
    OPT,  # variants/model.opt.onnx: onnxruntime's offline passes + onnxslim (fp32, lossless)
    INT8_DYNAMIC,  # --quantize dynamic: int8 weights, activations quantized at run time
    INT8_STATIC,  # --quantize static: calibrated QDQ int8
    FP16,  # --quantize fp16
    INT8_AUTO,  # --quantize auto: the search for the fastest int8 within budget, kept as `int8`
    INT8_WEIGHTS,  # decoders, --quantize int8-weights (or auto): MatMul weights in 8 bits by blocks
    INT4_WEIGHTS,  # decoders, --quantize int4-weights (or auto): MatMul weights in 4 bits by blocks
]
