"""`int8-dynamic`: int8 weights ahead of time, activations quantized as they come (onnxruntime's quantize_dynamic).

It pays on MatMul/Gemm (transformers); it never takes Conv, which onnxruntime would make ConvInteger,
measured 7.8x slower than fp32 on a PP-LCNet (docs/optimize.md): a graph without MatMul/Gemm/Gather
weights is not made (a note says so, and says to use static).

Weight scales are per channel unless the section says (`per_channel`). Where the section leaves it unset and
the per-channel candidate misses its budget, the per-tensor one is made and judged too (the same judge), and the
one that passes is kept; if neither does, the closer one (the larger margin) is recorded as failed. The variant's
settings say which was kept (`kept`), its note the other's verdict: per channel costs near ties where per tensor
kept them on two real models (Magika, the PP-OCRv4 recognizer; docs/real-models.md). An explicit
`per_channel` (true or false) is obeyed, with no second candidate.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from onnxruntime.quantization import quantize_dynamic

from pipeline.core.errors import ArtifactError
from pipeline.optimize.kind import Job, Made
from pipeline.optimize.nodes import DYNAMIC_OP_TYPES, quantizable_nodes
from pipeline.optimize.preprocess import quiet_advice
from pipeline.optimize.quantize import EXTRA_OPTIONS, Conversion, Quantizer, QuantSettings, int8_options
from pipeline.recipe.schema import OptimizeSpec
from pipeline.runtime.external_data import move_model


@dataclass(frozen=True)
class DynamicSettings(QuantSettings):
    """Dynamic int8's settings, and whether per tensor may stand in for a per-channel default that misses."""

    fallback: bool = False  # per_channel came from the default, not from the user: per tensor is tried if it fails

    def to_dict(self) -> dict[str, object]:
        settings = super().to_dict()
        del settings["fallback"]  # what was made is recorded; `kept` says when the fallback decided it
        return settings


class DynamicInt8(Quantizer):
    name, precision, choice, mode = "int8-dynamic", "int8", "dynamic", "dynamic"
    # per channel unless the section says otherwise: on the real all-MiniLM-L6-v2 over 64 texts, mean cosine 0.992
    # (per tensor 0.960) at the same speed (bench/bench_int8_per_channel.py, docs/gates.md "Embeddings")
    per_channel = True

    def config(self, spec: OptimizeSpec, task: str) -> DynamicSettings:
        settings = super().config(spec, task)
        return DynamicSettings(**vars(settings), fallback=spec.per_channel is None)

    def skip(self, source: Path, config: QuantSettings) -> str:
        if why := super().skip(source, config):
            return why
        if quantizable_nodes(source, "dynamic"):
            return ""
        return (
            f"{self.name} not made: the graph has no MatMul/Gemm/Gather with constant weights, and dynamic int8 never "
            "quantizes Conv (onnxruntime's ConvInteger is slower than fp32); use --quantize static"
        )

    def make(self, job: Job, config: QuantSettings) -> Made:
        """The candidate `config` asks for; per tensor too where per channel was the default and missed its budget."""
        first = super().make(job, config)
        if first.verdict.passed or not (isinstance(config, DynamicSettings) and config.fallback and config.per_channel):
            return first
        job.say(f"{self.name}: per channel (the default) missed its budget; trying per tensor")
        aside = job.scratch / f"{self.name}.per-tensor"
        aside.mkdir(exist_ok=True)
        try:
            second = super().make(replace(job, dst=aside / job.dst.name), replace(config, per_channel=False))
        except ArtifactError as exc:  # onnxruntime could not make it: per channel's record stands, with why
            shutil.rmtree(aside)
            first.settings["kept"] = "per-channel"
            first.note = f"per tensor (tried as per channel missed) not made: {exc}"
            return first
        if second.verdict.passed or second.verdict.margin > first.verdict.margin:
            move_model(aside / job.dst.name, job.dst)
            kept, other, why = second, first, "passed" if second.verdict.passed else "closer to the budget"
        else:
            kept, other, why = first, second, "closer to the budget"
        shutil.rmtree(aside)
        label = "per-channel" if kept.settings["per_channel"] else "per-tensor"
        other_label = "per tensor" if kept.settings["per_channel"] else "per channel"
        kept.settings["kept"] = label
        verdict = f"{other_label} {'passed' if other.verdict.passed else 'failed'}: {other.verdict.detail}"
        kept.note = " ".join(filter(None, [kept.note, f"{label} kept ({why}); {verdict}"]))
        job.say(f"{self.name}: {label} kept ({why})")
        return kept

    def convert(self, step: Conversion) -> None:
        # quantize_dynamic rewrites a Gemm `g` as MatMul `g_MatMul` before it quantizes: exclude both names
        excluded = [*step.excluded, *step.tail]
        options = int8_options(step.settings, excluded + [f"{n}_MatMul" for n in excluded])
        with quiet_advice():
            quantize_dynamic(step.source, step.out, op_types_to_quantize=list(DYNAMIC_OP_TYPES),
                             extra_options=dict(EXTRA_OPTIONS), use_external_data_format=step.external,
                             **options)  # fmt: skip


INT8_DYNAMIC = DynamicInt8()
