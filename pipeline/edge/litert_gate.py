"""The gate on LiteRT: each .tflite of one onnx2tf attempt judged against model.onnx.

`LiteRTGate` is the `judge` pipeline/edge/attempts.py hands each attempt's models to. Before
judging it stamps each model's feeding description as TFLite metadata (the file shipped is the
file verified); then it runs each on the LiteRT interpreter through the verifier, with the policy
of its precision (fp16 also by fp16's range, pipeline/edge/fp16range.py). Its `Judged` says whether
the attempt is kept: it is left when its fp32 model fails (a conversion's own fault, which other
onnx2tf settings may fix), never for a precision's own loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.artifact.directory import Artifact
from pipeline.artifact.variants import EDGE_PREFIX, MODEL_FILE
from pipeline.edge.convert import Converted
from pipeline.edge.device import DeviceCheck
from pipeline.edge.feeding import feeding_entry, stamp_metadata
from pipeline.edge.fp16range import fp16_range_rows
from pipeline.edge.plan import EdgePlan
from pipeline.runtime.runners import ort_runner, tflite_candidate
from pipeline.stagekit.contract import Progress
from pipeline.verify.gate import verify
from pipeline.verify.policies import Policy
from pipeline.verify.report import GateReport


@dataclass
class EdgeMade:
    """One edge model converted and judged."""

    name: str  # tflite-fp32 ...
    converted: Converted
    report: GateReport  # the gate's rows on LiteRT, then the device check's rows when it ran
    litert: bool  # the gate passed on LiteRT (before the device rows joined)
    policy: Policy  # what the gate held it to (the device check's tolerance follows from it)
    device: DeviceCheck | None = None  # what the device-like runtime did with it

    @property
    def passed(self) -> bool:
        """Verified on LiteRT, and runs on the device-like runtime when one was checked."""
        return self.report.passed


@dataclass
class Judged:
    """One attempt's models judged on LiteRT, with the feeding description stamped into each."""

    made: list[EdgeMade]
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)  # precision -> its feeding.json entry

    @property
    def failure(self) -> str | None:
        """Why the attempt is left (its fp32 model fails the gate), or None to keep it."""
        fp32 = next((m for m in self.made if m.converted.precision == "fp32"), None)
        return None if fp32 is None or fp32.report.passed else f"{fp32.name}: {first_failure(fp32.report)}"


@dataclass
class LiteRTGate:
    """Judges each attempt's models (called as `gate(converted)`); see the module doc."""

    artifact: Artifact
    plan: EdgePlan
    policies: dict[str, Policy]  # precision -> the policy its model is held to
    scratch: Path  # the stage's scratch directory: the gate's own files
    notes: list[str]  # a model that cannot carry metadata says so here
    progress: Progress

    def __call__(self, converted: list[Converted]) -> Judged:
        manifest = self.artifact.manifest
        entries = {c.precision: feeding_entry(f"{EDGE_PREFIX}{c.precision}", c, manifest) for c in converted}
        for c in converted:  # before judging: the file shipped is the file verified
            if not stamp_metadata(c.path, entries[c.precision], manifest):
                self.notes.append(f"{c.path.name} keeps its weights outside the flatbuffer: no TFLite metadata written")
        return Judged([self._judge(c) for c in converted], entries)

    def _judge(self, c: Converted) -> EdgeMade:
        name = f"{EDGE_PREFIX}{c.precision}"
        policy, evaluation, reference = self.policies[c.precision], self.plan.evaluation, self.artifact.path(MODEL_FILE)
        candidate = tflite_candidate(c.path, names=c.names, layout=c.input_layout, **c.scaling())
        report = verify(candidate, ort_runner(reference), evaluation, self.plan.spec, policy, scratch=self.scratch)
        if c.precision == "fp16":  # the cause before its symptom: a value fp16 cannot hold, then "exceeds atol"
            samples = None if evaluation.generated else evaluation.samples  # activations only on real samples
            report.rows[:0] = fp16_range_rows(reference, samples, self.scratch)
        status = "passed" if report.passed else "FAILED"
        size = c.path.stat().st_size
        self.progress(f"[edge] {name}: converted in {c.seconds:.1f} s, {size} bytes; {policy.name}: {status}")
        return EdgeMade(name, c, report, report.passed, policy)


def first_failure(report: GateReport) -> str:
    """The first failed check of `report` in one line, and how many more failed."""
    row = report.failures[0]
    more = f" (and {len(report.failures) - 1} more failed checks)" if len(report.failures) > 1 else ""
    return f"{row.check} {row.output}: {row.detail}{more}".strip()
