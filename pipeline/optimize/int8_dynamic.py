"""`int8-dynamic`: int8 weights ahead of time, activations quantized as they come (onnxruntime's quantize_dynamic).

It pays on MatMul/Gemm (transformers); it never takes Conv, which onnxruntime would make ConvInteger,
measured 7.8x slower than fp32 on a PP-LCNet (DESIGN.md section 5): a graph without MatMul/Gemm/Gather
weights is not made (a note says so, and says to use static).
"""

from __future__ import annotations

from pathlib import Path

from onnxruntime.quantization import quantize_dynamic

from pipeline.optimize.nodes import DYNAMIC_OP_TYPES, quantizable_nodes
from pipeline.optimize.quantize import EXTRA_OPTIONS, Conversion, Quantizer, QuantSettings, int8_options, quiet_advice


class DynamicInt8(Quantizer):
    name, precision, choice, mode = "int8-dynamic", "int8", "dynamic", "dynamic"
    # per channel unless the section says otherwise: on the real all-MiniLM-L6-v2 over 64 texts, mean cosine 0.992
    # (per tensor 0.960) at the same speed (bench/bench_int8_per_channel.py, docs/gates.md "Embeddings")
    per_channel = True

    def skip(self, source: Path, config: QuantSettings) -> str:
        if why := super().skip(source, config):
            return why
        if quantizable_nodes(source, "dynamic"):
            return ""
        return (
            f"{self.name} not made: the graph has no MatMul/Gemm/Gather with constant weights, and dynamic int8 never "
            "quantizes Conv (onnxruntime's ConvInteger is slower than fp32); use --quantize static"
        )

    def convert(self, step: Conversion) -> None:
        # quantize_dynamic rewrites a Gemm `g` as MatMul `g_MatMul` before it quantizes: exclude both names
        excluded = [*step.excluded, *step.tail]
        options = int8_options(step.settings, excluded + [f"{n}_MatMul" for n in excluded])
        with quiet_advice():
            quantize_dynamic(step.source, step.out, op_types_to_quantize=list(DYNAMIC_OP_TYPES),
                             extra_options=dict(EXTRA_OPTIONS), use_external_data_format=step.external,
                             **options)  # fmt: skip


INT8_DYNAMIC = DynamicInt8()
