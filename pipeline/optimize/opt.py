"""`opt`: model.onnx through onnxruntime's portable offline passes and onnxslim (graph.py), still fp32.

Lossless: it is held to the lossless policy (`judge.lossless`), not the quantization budget. Asked for
by the section's `graph` level (`none` skips it), not by `--quantize`. Made for decoders too: judged on their
logits teacher-forced (decoder.py); on python-llama it changed no logit and was 1.02-1.04x fp32 (noise).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pipeline.optimize.graph import optimize_graph
from pipeline.optimize.kind import Job, Kind, Made
from pipeline.recipe.schema import OptimizeSpec


@dataclass(frozen=True)
class GraphSettings:
    """How the graph is rewritten."""

    level: Literal["basic", "extended"]  # onnxruntime's offline level (never `all`: its layouts are CPU-specific)
    slim: bool  # onnxslim after onnxruntime's passes


class Opt(Kind[GraphSettings]):
    name, precision = "opt", "fp32"

    def serves(self, task: str) -> bool:
        return True

    def asked(self, spec: OptimizeSpec) -> bool:
        return spec.graph != "none"

    def config(self, spec: OptimizeSpec, task: str) -> GraphSettings:
        if spec.graph == "none":
            raise ValueError("the opt variant is not asked for at graph level none")
        return GraphSettings(spec.graph, spec.slim)

    def make(self, job: Job, config: GraphSettings) -> Made:
        job.say(f"opt: onnxruntime {config.level} passes{' + onnxslim' if config.slim else ''}")
        report = optimize_graph(job.source, job.dst, config.level, config.slim)
        for warning in report.warnings:
            job.say(f"opt: {warning}")
        verdict = job.judge(job.dst, job.judge.lossless, job.scratch)
        job.say(f"opt: nodes {report.nodes_before} -> {report.nodes_after}; {verdict.detail}")
        # `made_at`: the level that made it, lower than `graph` where onnxruntime's result there was refused
        settings = {"graph": config.level, "made_at": report.level, "slim": config.slim}
        return Made(self.name, self.precision, settings, verdict, report.to_dict())


OPT = Opt()
