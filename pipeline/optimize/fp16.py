"""`fp16`: weights and arithmetic in half precision, inputs and outputs kept fp32 (onnxruntime's converter).

No pre-processing and no calibration; the nodes onnxruntime's converter keeps in fp32
(DEFAULT_OP_BLOCK_LIST) and the excluded ones stay fp32.
"""

from __future__ import annotations

import onnx
from onnxruntime.transformers.float16 import convert_float_to_float16

from pipeline.optimize.order import sort_nodes
from pipeline.optimize.quantize import Conversion, Quantizer
from pipeline.runtime.external_data import save_model


class Fp16(Quantizer):
    name, precision, choice, mode = "fp16", "fp16", "fp16", "fp16"
    preprocess = False

    def convert(self, step: Conversion) -> None:
        model = onnx.load(str(step.source))  # the weights too: the converter rewrites them
        result = convert_float_to_float16(model, keep_io_types=True, node_block_list=step.excluded or None)
        sort_nodes(result.graph)  # the converter appends the input casts last: the checker refuses that
        save_model(result, step.out, step.external)


FP16 = Fp16()
