"""`fp16`: weights and arithmetic in half precision, inputs and outputs kept fp32 (onnxruntime's converter).

No pre-processing and no calibration; the nodes onnxruntime's converter keeps in fp32
(DEFAULT_OP_BLOCK_LIST) and the excluded ones stay fp32.
"""

from __future__ import annotations

import onnx
from onnxruntime.transformers.float16 import convert_float_to_float16

from pipeline.optimize.quantize import Conversion, Quantizer
from pipeline.runtime.external_data import save_model


class Fp16(Quantizer):
    name, precision, choice, mode = "fp16", "fp16", "fp16", "fp16"
    preprocess = False

    def convert(self, step: Conversion) -> None:
        model = onnx.load(str(step.source))  # the weights too: the converter rewrites them
        result = convert_float_to_float16(model, keep_io_types=True, node_block_list=step.excluded or None)
        _sort_topologically(result.graph)  # the converter appends the input casts last: the checker refuses that
        save_model(result, step.out, step.external)


def _sort_topologically(graph: onnx.GraphProto) -> None:
    """Reorder `graph.node` so every node comes after the nodes producing its inputs (stable otherwise)."""
    available = {t.name for t in graph.input} | {t.name for t in graph.initializer} | {""}
    pending = list(range(len(graph.node)))
    order: list[int] = []
    while pending:
        ready = [i for i in pending if all(name in available for name in graph.node[i].input)]
        if not ready:  # a cycle, or an input from an outer scope: keep the rest as it was
            order += pending
            break
        for i in ready:
            available.update(graph.node[i].output)
        order += ready
        taken = set(ready)
        pending = [i for i in pending if i not in taken]
    copies = [onnx.NodeProto.FromString(graph.node[i].SerializeToString()) for i in order]
    del graph.node[:]
    graph.node.extend(copies)


FP16 = Fp16()
