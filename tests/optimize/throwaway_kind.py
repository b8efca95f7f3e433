"""A throw-away variant kind, written as a new kind would be: one module, one class, its settings beside it.

`copy`: model.onnx as it is, with its exporter debug info dropped (graph.strip_debug_info): fp32,
lossless, judged like `opt`. It exists to show the loop over KINDS takes a new kind with one line.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from pipeline.optimize.graph import load, strip_debug_info
from pipeline.optimize.kind import Job, Kind, Made
from pipeline.recipe.schema import OptimizeSpec


@dataclass(frozen=True)
class CopySettings:
    """What the copy keeps."""

    debug_info: bool  # keep the exporter's per-node doc strings and metadata

    def to_dict(self) -> dict[str, object]:
        return {"debug_info": self.debug_info}


class Copy(Kind[CopySettings]):
    name, precision = "copy", "fp32"

    def asked(self, spec: OptimizeSpec) -> bool:
        return True  # the throw-away kind has no --quantize choice: it is made on every run

    def config(self, spec: OptimizeSpec, task: str) -> CopySettings:
        return CopySettings(debug_info=False)

    def make(self, job: Job, config: CopySettings) -> Made:
        model = load(job.source)
        removed = 0 if config.debug_info else strip_debug_info(model)
        onnx.save(model, str(job.dst))
        verdict = job.judge(job.dst, job.judge.lossless, job.scratch)
        job.say(f"copy: {removed} bytes of debug info dropped; {verdict.detail}")
        return Made(self.name, self.precision, config.to_dict(), verdict, {"debug_bytes_removed": removed})


COPY = Copy()


class CopyOfOpt(Copy):
    """The same copy, made from the `opt` variant of the same run: a kind with a parent variant."""

    name, parent = "copy-of-opt", "opt"


COPY_OF_OPT = CopyOfOpt()
