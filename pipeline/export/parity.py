"""The parity gate: prove an ONNX file computes what its reference computes, or fail with every reason.

Checks, all run before anything is decided (one table, then CheckFailed, exit 1):

- `onnx.checker` and strict shape inference;
- onnxruntime against the reference at batch 1, 2 and a larger N (a batch axis silently fixed at
  export shows up as a refusal or a wrong shape at one of them), and at a second length of every
  other symbolic axis (token models: a shorter sequence);
- per output: max abs and max relative difference, failing where |onnx - ref| > atol + rtol*|ref|
  (numpy's allclose rule), and any NaN/Inf;
- the task metric over a whole evaluation split, ONNX against the reference, within a tolerance.

The reference is any callable from named numpy inputs to named numpy outputs (the torch module, or
the recorded golden outputs), so this module needs neither torch nor a particular exporter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import CheckFailed
from pipeline.manifest import TensorSpec

Arrays = dict[str, np.ndarray]
Reference = Callable[[Arrays], Arrays]
LARGE_BATCH = 16  # the "larger N": big enough to catch an axis fixed at 1 or 2, cheap enough for CI
EVAL_CHUNK = 256


@dataclass(frozen=True)
class Tolerance:
    atol: float = 1e-4  # per-element absolute difference allowed
    rtol: float = 1e-3  # plus this fraction of the reference's magnitude
    metric: float = 1e-3  # |metric(onnx) - metric(reference)| allowed


@dataclass
class Row:
    """One line of the gate's table."""

    check: str  # "checker", "shape inference", "batch 2", "batch 2, sequence 8", "metric accuracy"
    output: str  # the output it concerns, or "-"
    passed: bool
    detail: str = ""
    max_abs: float | None = None
    max_rel: float | None = None


@dataclass
class GateReport:
    """Every row the gate produced, plus the metric on both sides."""

    rows: list[Row] = field(default_factory=list)
    metric: dict[str, Any] = field(default_factory=dict)  # {"name", "reference", "onnx", "difference", "samples"}

    @property
    def failures(self) -> list[Row]:
        return [r for r in self.rows if not r.passed]

    @property
    def passed(self) -> bool:
        return not self.failures

    def table(self, only_failures: bool = False) -> str:
        """A fixed-width text table; the CLI prints it, CheckFailed carries it."""
        rows = self.failures if only_failures else self.rows
        head = ("check", "output", "status", "max abs", "max rel", "detail")
        body = [
            (r.check, r.output, "ok" if r.passed else "FAIL", _num(r.max_abs), _num(r.max_rel), r.detail) for r in rows
        ]
        widths = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=True)]
        return "\n".join(
            "  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)).rstrip() for line in (head, *body)
        )

    def raise_on_failure(self, what: str) -> None:
        if self.failures:
            raise CheckFailed(
                f"{what} failed the parity gate ({len(self.failures)} of {len(self.rows)} checks):\n"
                + self.table(only_failures=True)
            )

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "rows": [asdict(r) for r in self.rows], "metric": self.metric}

    def summary(self) -> dict[str, Any]:
        """The gate in a few numbers, for a variant record: passed, worst differences, checks run."""
        abs_diffs = [r.max_abs for r in self.rows if r.max_abs is not None]
        rel_diffs = [r.max_rel for r in self.rows if r.max_rel is not None]
        return {
            "passed": self.passed,
            "checks": len(self.rows),
            "failed": len(self.failures),
            "max_abs": max(abs_diffs, default=None),
            "max_rel": max(rel_diffs, default=None),
        }


def _num(x: float | None) -> str:
    return "" if x is None else f"{x:.3g}"


def ort_session(path: Path, threads: int = 1) -> Any:
    """A CPU onnxruntime session: the provider every machine has, and the one parity is defined on."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def session_reference(session: Any) -> Reference:
    """Adapt an onnxruntime session to the gate's callable form."""
    names = [o.name for o in session.get_outputs()]

    def run(inputs: Arrays) -> Arrays:
        return dict(zip(names, session.run(names, inputs), strict=True))

    return run


def structural_checks(path: Path, scratch: Path) -> list[Row]:
    """onnx.checker and strict shape inference, each as a row (never raising)."""
    import onnx
    import onnx.shape_inference

    rows = []
    try:
        onnx.checker.check_model(str(path))
        rows.append(Row("checker", "-", True))
    except (onnx.checker.ValidationError, ValueError, OSError) as exc:
        rows.append(Row("checker", "-", False, _first_line(exc)))
    try:
        onnx.shape_inference.infer_shapes_path(str(path), str(scratch / "inferred.onnx"), strict_mode=True)
        rows.append(Row("shape inference", "-", True))
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError, ValueError, OSError) as exc:
        rows.append(Row("shape inference", "-", False, _first_line(exc)))
    return rows


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


def cases(samples: Arrays, inputs: list[TensorSpec], large: int = LARGE_BATCH) -> Iterator[tuple[str, Arrays]]:
    """The inputs the gate runs: batch 1, 2 and N, then each other symbolic axis at a second length.

    Symbolic dims are those the specs name; a model declaring a fixed batch runs once, as given.
    """
    count = len(next(iter(samples.values())))
    if any(not spec.shape or isinstance(spec.shape[0], int) for spec in inputs):
        # A declared fixed batch: other sizes are not valid inputs, so the samples run as they are.
        yield f"fixed batch {count}", samples
        return
    for batch in (1, 2, max(large, 3)):
        # Fewer samples than the batch: repeat them; the point is the batch axis, not new data.
        index = np.arange(batch) % count
        yield f"batch {batch}", {k: v[index] for k, v in samples.items()}
    for spec in inputs:
        for axis, dim in enumerate(spec.shape):
            if axis == 0 or not isinstance(dim, str):
                continue
            length = samples[spec.name].shape[axis]
            shorter = max(1, length // 2)
            if shorter == length:
                continue
            batch = {k: v[np.arange(2) % count] for k, v in samples.items()}
            # Cut every input that shares this dim name, so related inputs stay consistent.
            for other in inputs:
                for ax, d in enumerate(other.shape):
                    if d == dim:
                        batch[other.name] = np.take(batch[other.name], np.arange(shorter), axis=ax)
            yield f"batch 2, {dim} {shorter}", batch


def compare(label: str, got: Arrays, want: Arrays, outputs: list[TensorSpec], tol: Tolerance) -> list[Row]:
    """Per-output rows: shape, NaN/Inf, and the max abs / rel difference against the tolerance."""
    rows = []
    for spec in outputs:
        name = spec.name
        if name not in got:
            rows.append(Row(label, name, False, f"ONNX model has no output {name!r} (it has {sorted(got)})"))
            continue
        a = np.asarray(got[name])
        b = np.asarray(want[name])
        if a.shape != b.shape:
            rows.append(Row(label, name, False, f"shape {list(a.shape)} but the reference gives {list(b.shape)}"))
            continue
        if not np.issubdtype(b.dtype, np.number) or b.dtype == np.bool_:
            same = bool(np.array_equal(a, b))
            rows.append(Row(label, name, same, "" if same else "values differ"))
            continue
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        bad = [
            f"{side} has {int((~np.isfinite(x)).sum())} NaN/Inf"
            for side, x in (("ONNX", a64), ("reference", b64))
            if not np.isfinite(x).all()
        ]
        diff = np.abs(a64 - b64)
        max_abs = float(np.nanmax(diff)) if diff.size else 0.0
        max_rel = float(np.nanmax(diff / np.maximum(np.abs(b64), tol.atol))) if diff.size else 0.0
        over = diff > tol.atol + tol.rtol * np.abs(b64)
        if over.any():
            bad.append(f"{int(over.sum())} of {over.size} values exceed atol {tol.atol:g} + rtol {tol.rtol:g}*|ref|")
        rows.append(Row(label, name, not bad, "; ".join(bad), max_abs, max_rel))
    return rows


def task_metric(task: str, logits: np.ndarray, target: np.ndarray) -> tuple[str, float] | None:
    """The metric the gate compares: accuracy for classifiers, mean abs error for regression."""
    if task == "classification":
        return "accuracy", float((logits.argmax(axis=-1) == target.reshape(-1)).mean())
    if task == "regression":
        return "mae", float(np.abs(logits.reshape(len(target), -1) - target.reshape(len(target), -1)).mean())
    return None


def _run_chunks(run: Reference, inputs: Arrays, output: str) -> np.ndarray:
    count = len(next(iter(inputs.values())))
    parts = [run({k: v[i : i + EVAL_CHUNK] for k, v in inputs.items()})[output] for i in range(0, count, EVAL_CHUNK)]
    return np.concatenate(parts)


def verify(
    path: Path,
    reference: Reference,
    samples: Arrays,
    inputs: list[TensorSpec],
    outputs: list[TensorSpec],
    tol: Tolerance,
    task: str = "classification",
    evaluation: tuple[Arrays, np.ndarray] | None = None,
    recorded: Arrays | None = None,
    scratch: Path | None = None,
    session: Any = None,
) -> GateReport:
    """Run every check on the ONNX file at `path` against `reference`; never raises on a mismatch.

    `samples` are real inputs (golden), `evaluation` the whole test split with its target for the
    metric. `recorded` are outputs stored earlier for all of `samples` (golden.npz): the file must
    reproduce them too. `session`: an `ort_session(path)` the caller already holds, so a large
    model is not loaded twice. Call `raise_on_failure` on the result to turn failures into exit 1.
    """
    import tempfile

    path = Path(path)
    report = GateReport()
    with tempfile.TemporaryDirectory(dir=scratch) as tmp:
        report.rows += structural_checks(path, Path(tmp))
    if session is None:
        try:
            session = ort_session(path)
        except Exception as exc:  # onnxruntime raises its own exception types; every one is a failure row
            report.rows.append(Row("onnxruntime load", "-", False, _first_line(exc)))
            return report
    run = session_reference(session)
    for label, batch in cases(samples, inputs):
        try:
            want = reference(batch)
        except Exception as exc:  # the reference itself cannot run this case: a finding, not a crash
            report.rows.append(Row(label, "-", False, f"the reference failed: {_first_line(exc)}"))
            continue
        try:
            got = run(batch)
        except Exception as exc:  # a fixed axis makes onnxruntime refuse the batch: that is the finding
            report.rows.append(Row(label, "-", False, f"onnxruntime refused the input: {_first_line(exc)}"))
            continue
        report.rows += compare(label, got, want, outputs, tol)
    if recorded is not None:
        try:
            report.rows += compare("golden (recorded)", run(samples), recorded, outputs, tol)
        except Exception as exc:  # as above
            report.rows.append(
                Row("golden (recorded)", "-", False, f"onnxruntime refused the input: {_first_line(exc)}")
            )
    if evaluation is not None:
        report.rows.append(_metric_row(report, run, reference, evaluation, outputs[0].name, task, tol))
    return report


def _metric_row(
    report: GateReport,
    run: Reference,
    reference: Reference,
    evaluation: tuple[Arrays, np.ndarray],
    output: str,
    task: str,
    tol: Tolerance,
) -> Row:
    data, target = evaluation
    try:
        got = _run_chunks(run, data, output)
    except Exception as exc:  # same as above: a refusal is a failed row
        return Row("metric", output, False, f"onnxruntime refused the evaluation split: {_first_line(exc)}")
    measured = task_metric(task, got, target)
    if measured is None:
        return Row("metric", output, True, f"no task metric for {task!r}")
    name, onnx_value = measured
    try:
        want = _run_chunks(reference, data, output)
    except Exception as exc:  # the reference cannot run the split: a finding, as in `verify`
        return Row(f"metric {name}", output, False, f"the reference failed on the evaluation split: {_first_line(exc)}")
    _, ref_value = task_metric(task, want, target) or (name, float("nan"))
    difference = abs(onnx_value - ref_value)
    report.metric = {
        "name": name,
        "reference": ref_value,
        "onnx": onnx_value,
        "difference": difference,
        "samples": len(target),
    }
    passed = difference <= tol.metric
    detail = f"reference {ref_value:.4f}, onnx {onnx_value:.4f} on {len(target)} samples"
    if not passed:
        detail += f"; differs by {difference:.4g} > tolerance {tol.metric:g}"
    return Row(f"metric {name}", output, passed, detail)
