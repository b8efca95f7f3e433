"""Weight-only quantization of a decoder: MatMul weights stored in 8 or 4 bits by blocks, activations left fp32.

onnxruntime's `MatMulNBitsQuantizer` rewrites each MatMul with a constant weight as `MatMulNBits`
(com.microsoft): the weight in `bits` bits, one scale (and, asymmetric, one zero point) per block of
`block_size` values along its input axis; `accuracy_level` is the precision the CPU kernel computes in
(0: the weights dequantized to fp32; 4: int8 activations, the fastest, reported to pick other greedy
tokens on some models: onnxruntime issue 29849; the judge sees that). With `embeddings` the token
embedding (a Gather) is stored the same way (`GatherBlockQuantized`, which needs opset 21: the
quantizer raises the graph's opset).

A `Gemm` with a constant weight (GPT-2's blocks are exported so) is rewritten as MatMul and Add first
(`gemm_as_matmul`): the quantizer takes MatMul only. The output projection (lm_head) is a MatMul and is
quantized with the rest. When it is **tied** to the
embedding, the exported graph computes its weight as a Transpose of the embedding table, which the
quantizer skips (it takes constant weights only): `untie_lm_head` gives that MatMul the transposed
table as its own constant first, so the largest MatMul of a small model is not left in fp32 (the
embedding stays as it is for the Gather, or is quantized on its own with `embeddings`).

Activations are never quantized: no calibration, and the judge compares text, not tensors.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from pipeline.core.errors import ArtifactError, first_line
from pipeline.optimize.kind import Job, Kind, Made
from pipeline.recipe.defaults import DECODER_CHOICES
from pipeline.recipe.schema import OptimizeSpec

TEXT_GENERATION = "text-generation"


@dataclass(frozen=True)
class WeightSettings:
    """How a weight-only variant stores its weights (the optimize section's `weight_*` keys)."""

    bits: int  # 8 or 4
    block_size: int  # values sharing one scale, along the weight's input axis (a power of 2, >= 16)
    symmetric: bool  # no zero point: signed values around 0
    accuracy_level: int  # MatMulNBits' compute precision on CPU: 0 (fp32, as stored), 1 fp32, 2 fp16, 3 bf16, 4 int8
    embeddings: bool  # the token embedding (Gather) stored the same way too

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        kind = "symmetric" if self.symmetric else "asymmetric"
        tail = ", embeddings too" if self.embeddings else ""
        return f"{self.bits}-bit weights, block {self.block_size}, {kind}, accuracy level {self.accuracy_level}{tail}"


@dataclass(frozen=True)
class WeightReport:
    """What the conversion did, for the variant's details."""

    quantized: int  # MatMul (and Gather) nodes now stored in `bits` bits
    kept: list[str]  # MatMul nodes with a constant weight left in fp32 (and why, in the name's note)
    untied: list[str]  # lm_head MatMuls given their own copy of a tied embedding
    embedding_kept: bool = False  # embeddings were asked for and a Gather still reads an fp32 table
    gemms: list[str] = field(default_factory=list)  # Gemm nodes rewritten as MatMul (+ Add) to be quantized

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def quantize_weights(source: Path, dst: Path, settings: WeightSettings) -> WeightReport:
    """Write the weight-only variant of the decoder at `source` to `dst`; ArtifactError when the quantizer fails."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    model = onnx.load(str(source))
    untied = untie_lm_head(model.graph)
    gemms = gemm_as_matmul(model.graph)
    op_types = ("MatMul", "Gather") if settings.embeddings else ("MatMul",)
    quantizer = MatMulNBitsQuantizer(
        model,
        bits=settings.bits,
        block_size=settings.block_size,
        is_symmetric=settings.symmetric,
        accuracy_level=settings.accuracy_level,
        op_types_to_quantize=op_types,
        quant_axes=(("MatMul", 0), ("Gather", 1)),
    )
    quantizer_log = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
    level = quantizer_log.level
    quantizer_log.setLevel(logging.ERROR)  # its per-node info and the opset-21 warning for Gather
    try:
        quantizer.process()
    except Exception as exc:  # the quantizer raises what its helpers raise (AssertionError, ValueError, KeyError)
        raise ArtifactError(f"MatMulNBitsQuantizer ({settings.describe()}) failed: {first_line(exc)}") from exc
    finally:
        quantizer_log.setLevel(level)
    out = quantizer.model.model
    size = out.ByteSize()
    if size > 1_800_000_000:  # past protobuf's 2 GB limit: weights beside the graph
        onnx.save(out, str(dst), save_as_external_data=True, location=dst.name + ".data")
    else:
        onnx.save(out, str(dst))
    nodes = out.graph.node
    quantized = sum(1 for n in nodes if n.op_type in ("MatMulNBits", "GatherBlockQuantized"))
    constants = {t.name for t in out.graph.initializer}
    kept = [n.name for n in nodes if n.op_type == "MatMul" and len(n.input) > 1 and n.input[1] in constants]
    table_kept = any(n.op_type == "Gather" and n.input[0] in constants for n in nodes)
    return WeightReport(quantized, kept, untied, settings.embeddings and table_kept, gemms)


def gemm_as_matmul(graph: Any) -> list[str]:
    """Rewrite each `Gemm(A, B[, C])` with a constant 2-D B, alpha 1, A not transposed (and beta 1 when C is
    given) as `MatMul(A, B)` then `Add(C)`: the quantizer takes MatMul only, and GPT-2's blocks are
    exported as Gemm (its Conv1D layers). A `transB` Gemm gets B transposed as its own constant. Returns
    the Gemms rewritten; any other Gemm is left as it is (and stays fp32: `WeightReport.kept` lists MatMuls).
    """
    from onnx import helper, numpy_helper

    constants = {t.name: t for t in graph.initializer}
    rewritten, nodes = [], []
    for node in graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
        plain = attrs.get("alpha", 1.0) == 1.0 and not attrs.get("transA", 0) and (
            bias is None or attrs.get("beta", 1.0) == 1.0)  # fmt: skip
        weight = node.input[1] if node.op_type == "Gemm" and len(node.input) > 1 else ""
        if not (node.op_type == "Gemm" and plain and weight in constants and len(constants[weight].dims) == 2):
            nodes.append(node)
            continue
        if attrs.get("transB", 0):
            table = numpy_helper.to_array(constants[weight])
            weight = f"{weight}.transposed_for_{node.name or 'gemm'}"
            graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(table.T), weight))
        product = node.output[0] if bias is None else f"{node.output[0]}.matmul"
        nodes.append(helper.make_node("MatMul", [node.input[0], weight], [product], name=f"{node.name}.matmul"))
        if bias is not None:
            nodes.append(helper.make_node("Add", [product, bias], [node.output[0]], name=f"{node.name}.bias"))
        rewritten.append(node.name)
    if rewritten:
        del graph.node[:]
        graph.node.extend(nodes)
    return rewritten


def untie_lm_head(graph: Any) -> list[str]:
    """Give each MatMul whose weight is `Transpose(constant)` the transposed constant as its own weight.

    A tied lm_head is exported that way (the embedding table [vocab, hidden] transposed to [hidden, vocab]);
    the quantizer takes only constant weights. A Transpose nothing reads any more is removed.
    Returns the MatMuls rewritten.
    """
    from onnx import numpy_helper

    constants = {t.name: t for t in graph.initializer}
    transposed = {}
    for node in graph.node:
        if node.op_type == "Transpose" and node.input[0] in constants:
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
            if perm in (None, [1, 0]) and len(constants[node.input[0]].dims) == 2:
                transposed[node.output[0]] = node.input[0]
    rewritten = []
    for node in graph.node:
        if node.op_type == "MatMul" and len(node.input) > 1 and node.input[1] in transposed:
            table = numpy_helper.to_array(constants[transposed[node.input[1]]])
            name = f"{transposed[node.input[1]]}.transposed_for_{node.name or 'matmul'}"
            graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(table.T), name))
            node.input[1] = name
            rewritten.append(node.name)
    if rewritten:
        used = {i for n in graph.node for i in n.input}
        keep = [n for n in graph.node if n.op_type != "Transpose" or n.output[0] in used]
        if len(keep) != len(graph.node):
            del graph.node[:]
            graph.node.extend(keep)
    return rewritten


class WeightOnly(Kind[WeightSettings]):
    """A weight-only kind of a decoder (`int8-weights`, `int4-weights`): one per bit width, settings shared.

    Made for text-generation models only (a classifier's int8 is `dynamic` / `static`). Asked for by its
    own `--quantize` choice, by `auto` (both are made, the smallest within budget kept: decoder.py), and
    by a section asking for no decoder kind at all (the default `[dynamic, static]` means, for a decoder,
    both weight-only kinds: its activations are not quantized, measured worse: docs/language-models.md).
    """

    bits: ClassVar[int]

    def serves(self, task: str) -> bool:
        return task == TEXT_GENERATION

    def asked(self, spec: OptimizeSpec) -> bool:
        return bool({self.choice, "auto"} & set(spec.quantize)) or not set(spec.quantize) & set(DECODER_CHOICES)

    def config(self, spec: OptimizeSpec, task: str) -> WeightSettings:
        return WeightSettings(
            self.bits, spec.weight_block_size, spec.weight_symmetric, spec.weight_accuracy_level, spec.weight_embeddings
        )

    def make(self, job: Job, config: WeightSettings) -> Made:
        job.say(f"{self.name}: {config.describe()} (onnxruntime MatMulNBits)")
        report = quantize_weights(job.source, job.dst, config)
        untied = f"; lm_head untied from the embedding ({', '.join(report.untied)})" if report.untied else ""
        job.say(f"{self.name}: {report.quantized} nodes quantized, {len(report.kept)} MatMul kept fp32{untied}")
        verdict = job.judge(job.dst, None, job.scratch)
        job.say(f"{self.name}: {'passed' if verdict.passed else 'FAILED'}: {verdict.detail}")
        note = (
            f"the token embedding stays fp32: onnxruntime's quantizer did not store its Gather in {self.bits} bits"
            if report.embedding_kept
            else ""
        )
        return Made(self.name, self.precision, config.to_dict(), verdict, report.to_dict(), note=note)
