"""The gate on LiteRT: each .tflite of one onnx2tf attempt judged against model.onnx.

`LiteRTGate` is the `judge` pipeline/edge/attempts.py hands each attempt's models to. Before
judging it stamps each model's feeding description as TFLite metadata (the file shipped is the
file verified); then it runs each on the LiteRT interpreter through the verifier, with the policy
of its precision (fp16 also by fp16's range, pipeline/edge/fp16range.py). Its `Judged` says whether
the attempt is kept: it is left only when its fp32 model fails the way a conversion fails
(`conversion_fault`: an input refused, a shape or an output wrong or missing, NaN/Inf, or values
wrong wholesale, more than 1% of an output's), which other onnx2tf settings may fix. A verdict
about accuracy (a few values out of tolerance, the task metric off by a little) is kept, said in
the record (`stopped`), and fails the stage: another onnx2tf setting converts the same graph to the
same float32 arithmetic, and one value over atol once sent onnx2tf through four more attempts
(21 minutes). A precision's own loss (fp16, int8) never leaves an attempt.
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
from pipeline.verify.policies import DEFAULT_HARD, Policy
from pipeline.verify.report import GateReport

WHOLESALE = 0.01  # a lossless output with more than this share of values far out of tolerance was converted wrong


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
        """Why the attempt is left (its fp32 model fails as a conversion fails), or None to keep it."""
        fp32 = self._fp32_failed()
        if fp32 is None or (fault := conversion_fault(fp32.report)) is None:
            return None
        return f"{fp32.name}: {fault}"

    @property
    def stopped(self) -> str | None:
        """Why no other onnx2tf setting is tried though the fp32 model failed (its verdict is about accuracy)."""
        fp32 = self._fp32_failed()
        if fp32 is None or conversion_fault(fp32.report) is not None:
            return None
        return (f"kept, no other onnx2tf setting tried: {fp32.name} failed on accuracy, not conversion "
                f"({first_failure(fp32.report)})")  # fmt: skip

    def _fp32_failed(self) -> EdgeMade | None:
        fp32 = next((m for m in self.made if m.converted.precision == "fp32"), None)
        return None if fp32 is None or fp32.report.passed else fp32


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
        candidate = tflite_candidate(c.path, names=c.names, layout=c.input_layout, batch=c.fixed_batch, **c.scaling())
        report = verify(candidate, ort_runner(reference), evaluation, self.plan.spec, policy, scratch=self.scratch)
        if c.precision == "fp16":  # the cause before its symptom: a value fp16 cannot hold, then "exceeds atol"
            samples = None if evaluation.generated else evaluation.samples  # activations only on real samples
            report.rows[:0] = fp16_range_rows(reference, samples, self.scratch, c.path)
        status = "passed" if report.passed else "FAILED"
        size = c.path.stat().st_size
        self.progress(f"[edge] {name}: converted in {c.seconds:.1f} s, {size} bytes; {policy.name}: {status}")
        return EdgeMade(name, c, report, report.passed, policy)


def conversion_fault(report: GateReport) -> str | None:
    """The first failed row of a lossless model's `report` that a conversion's fault explains, or None when every
    failure is about accuracy (values near their reference but past a tolerance, the metric a little off).

    A conversion's fault: a check that compared no values (an input refused, a shape or an output wrong or
    missing, a load or structural check), NaN/Inf, or values wrong wholesale: more than `WHOLESALE` of an
    output's out of tolerance and some far out, past the policy's hard bound (a transposed axis, a broken op)."""
    for row in report.failures:
        measured = row.share is not None or (row.check.startswith("metric") and row.detail.startswith("reference "))
        wholesale = (row.share or 0.0) > WHOLESALE and (row.worst or 0.0) > DEFAULT_HARD
        if not measured or "NaN/Inf" in row.detail or wholesale:
            return f"{row.check} {row.output}: {row.detail}".strip()
    return None


def first_failure(report: GateReport) -> str:
    """The first failed check of `report` in one line, and how many more failed."""
    row = report.failures[0]
    more = f" (and {len(report.failures) - 1} more failed checks)" if len(report.failures) > 1 else ""
    return f"{row.check} {row.output}: {row.detail}{more}".strip()
