"""The device check: each edge model run by the stand-alone runner in a device-like environment.

Many devices still have tflite-runtime 2.14, not LiteRT, and it fails differently: it cannot load
some ops, and it can crash outright (SIGABRT on heap corruption, seen on a model converted with
free spatial dims). The check runs pipeline/runtime/tflite_runner.py as a script under that
environment's Python on golden.npz, with the model's `feeding.json` beside it (so no --layout or
--name), and turns what happened into the gate's rows, one per output:

- it ran: fp32's outputs each within atol + rtol x the output's scale (its largest |golden| value),
  the recorded policy's rtol with a floor on atol (DEVICE_ATOL), so a house-price regression (~3e5)
  is held to its own scale, not to a bare 1e-3; fp16 and int8 (lossy: their accuracy is the task's
  budget the gate measured on LiteRT, docs/gates.md) only have to run and give finite outputs;
- it could not load or run the model: the runner's own error;
- it crashed: the signal's name and the last lines the child wrote (a child killed by a signal
  prints no result, and its first line is an INFO banner that says nothing).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path

from pipeline.verify.policies import Exact, Policy
from pipeline.verify.report import Row

DEVICE_PYTHON_ENV = "PIPE_EDGE_PYTHON"  # a Python holding only numpy<2 and tflite-runtime (a device's runtime)
DEVICE_ATOL = {"fp32": 1e-3}  # the least atol on the device; fp16 and int8 (lossy): only that they run
TIMEOUT_S = 300.0  # one model on the golden inputs
TAIL_LINES = 3  # the child's last lines kept when it crashed or printed no result


@dataclass
class DeviceCheck:
    """What one model did on the device-like runtime."""

    runtime: str  # e.g. "tflite_runtime 2.14.0"
    ran: bool  # ran on every golden sample, each output present, finite and within tolerance
    detail: str  # why not (empty when it ran)
    rows: list[Row] = field(default_factory=list)  # the gate's rows: one per output, or one for a crash

    @property
    def check(self) -> str:
        return f"device {self.runtime}"


def device_python() -> Path | None:
    """The device-like environment's Python: $PIPE_EDGE_PYTHON, else the repository's .venv-edge if built."""
    if value := os.environ.get(DEVICE_PYTHON_ENV):
        return Path(value)
    built = Path(__file__).resolve().parents[2] / ".venv-edge" / "bin" / "python"
    return built if built.exists() else None


def runner_file() -> Path:
    """pipeline/runtime/tflite_runner.py, located, not imported: it runs as a script."""
    return Path(find_spec("pipeline.runtime.tflite_runner").origin)


def device_runtime(python: Path) -> str:
    """The runtime the runner would use under `python`, e.g. "tflite_runtime 2.14.0" ("tflite-runtime" if unknown)."""
    try:
        proc = subprocess.run([str(python), "-I", str(runner_file()), "--runtime-info"], capture_output=True,
                              text=True, timeout=60, check=False)  # fmt: skip
        info = json.loads(proc.stdout.strip().splitlines()[-1])
        return f"{info['runtime']} {info['runtime_version']}"
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError, KeyError, TypeError):
        return "tflite-runtime"


def device_tolerance(precision: str, policy: Policy) -> tuple[float, float] | None:
    """(atol, rtol) on the device for a model the gate held to `policy`: an element-wise one's, with a floor on
    atol; None for a budgeted (lossy) one: fp16 and int8 must run and give finite outputs."""
    if precision not in DEVICE_ATOL or not isinstance(policy, Exact):
        return None
    return max(policy.atol, DEVICE_ATOL[precision]), policy.rtol


def device_check(
    python: Path, model: Path, golden: Path, tolerance: tuple[float, float] | None, runtime: str = "tflite-runtime"
) -> DeviceCheck:
    """Run `model` (feeding.json beside it) on `golden` under `python`; see the module doc."""
    cmd = [str(python), "-I", str(runner_file()), str(model), str(golden)]
    if tolerance is not None:
        cmd += ["--atol", repr(tolerance[0]), "--rtol", repr(tolerance[1])]
    check = f"device {runtime}"
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        detail = f"did not finish within {TIMEOUT_S:.0f} s; last output: {_tail(_text(exc.stdout), _text(exc.stderr))}"
        return _failed(runtime, check, detail)
    except OSError as exc:
        return _failed(runtime, check, f"the device-like runtime could not be started: {exc}")
    if proc.returncode < 0:
        return _failed(runtime, check, f"crashed ({_signal_name(-proc.returncode)}) running {model.name}; "
                                       f"last output: {_tail(proc.stdout, proc.stderr)}")  # fmt: skip
    try:
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return _failed(runtime, check, f"exited {proc.returncode} without a result; "
                                       f"last output: {_tail(proc.stdout, proc.stderr)}")  # fmt: skip
    if result.get("runtime"):
        runtime = f"{result['runtime']} {result.get('runtime_version') or ''}".strip()
        check = f"device {runtime}"
    if "error" in result:
        return _failed(runtime, check, f"does not run: {result['error']}"[:500])
    rows = [_row(check, name, out) for name, out in result.get("outputs", {}).items()]
    failed = [r for r in rows if not r.passed]
    if proc.returncode != 0 and not failed:  # the runner said no without a row saying why
        failed = [Row(check, "-", False, f"exited {proc.returncode}; last output: {_tail(proc.stdout, proc.stderr)}")]
        rows += failed
    detail = "; ".join(f"{r.output}: {r.detail}" for r in failed)
    return DeviceCheck(runtime, not failed, detail[:500], rows)


def _row(check: str, name: str, out: dict) -> Row:
    if "error" in out:
        return Row(check, name, False, str(out["error"]))
    max_abs, scale = float(out["max_abs"]), float(out.get("scale") or 0.0)
    max_rel = max_abs / scale if scale else None
    if out.get("non_finite"):
        return Row(check, name, False, f"{out['non_finite']} NaN/Inf values", max_abs, max_rel)
    if "tolerance" not in out:
        return Row(check, name, True, "runs (lossy: judged by its budget on LiteRT, not compared)", max_abs, max_rel)
    tolerance = float(out["tolerance"])
    verdict = "within" if out.get("within") else "exceeds"
    detail = f"{verdict} {tolerance:.3g} (atol + rtol x the output's scale {scale:.3g})"
    return Row(check, name, bool(out.get("within")), detail, max_abs, max_rel)


def _failed(runtime: str, check: str, detail: str) -> DeviceCheck:
    return DeviceCheck(runtime, False, detail, [Row(check, "-", False, detail)])


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _text(data: bytes | str | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def _tail(stdout: str, stderr: str) -> str:
    """The child's last non-empty lines (stderr last: a crash and the runtime's log go there), as one line."""
    lines = [line.strip() for text in (stdout, stderr) for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-TAIL_LINES:])[-400:] or "nothing"
