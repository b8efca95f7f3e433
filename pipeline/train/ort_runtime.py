"""The isolated ONNX Runtime training runtime, and the worker process run in it.

onnxruntime-training 1.19.2 (the last release) is the same `onnxruntime` module as the main
environment's onnxruntime 1.32, and older, so the two never share a process: `make ort-runtime`
installs it alone into `.venv-ort` (a `pip install --target` directory with the numpy it was built
for), and `pipe train --backend ort` runs pipeline/train/ort_worker.py with this Python and
PYTHONPATH set to that directory, so only the worker sees it. Everything else the worker imports
(onnx, protobuf, sympy) comes from this environment. Outside the repository, point
`PIPE_ORT_RUNTIME` at such a directory (docs/install.md).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from pipeline.core.errors import InputError, PipelineError

RUNTIME_ENV = "PIPE_ORT_RUNTIME"  # a directory holding onnxruntime-training (pip install --target DIR)
MAKE_TARGET = "make ort-runtime"


def runtime_dir() -> Path:
    """The directory holding onnxruntime-training: $PIPE_ORT_RUNTIME, else the repository's .venv-ort."""
    given = os.environ.get(RUNTIME_ENV)
    found = Path(given) if given else Path(__file__).resolve().parents[2] / ".venv-ort"
    if not (found / "onnxruntime" / "training").is_dir():
        where = f"${RUNTIME_ENV} ({given})" if given else str(found)
        raise InputError(
            f"the ONNX Runtime training runtime is not installed at {where}; build it with `{MAKE_TARGET}` "
            f"(or set {RUNTIME_ENV} to a `pip install --target DIR --no-deps onnxruntime-training==1.19.2 "
            "numpy==1.26.4` directory; docs/install.md)"
        )
    return found


class WorkerFailed(PipelineError):
    """The ORT training worker stopped with an error; the last checkpoint is kept for --resume."""


def run_worker(job: Path, on_event: Callable[[dict[str, Any]], None], log: Path) -> None:
    """Run the worker on `job` (a JSON file), handing each event it prints to `on_event`.

    A `checkpoint` event is answered on the worker's stdin after `on_event` returns (which flushes
    metrics.jsonl): the worker renames a checkpoint into place only then.

    Its stderr goes to `log`; a failure raises WorkerFailed with the log's last line. The worker
    dies with this process (PR_SET_PDEATHSIG), so a `kill -9` of `pipe train` stops training too.
    """
    script = Path(find_spec("pipeline.train.ort_worker").origin)  # located, not imported: it runs as a script
    env = dict(os.environ, PYTHONPATH=str(runtime_dir()))  # that directory first: its onnxruntime, not ours
    cmd = [sys.executable, str(script), str(job)]
    with open(log, "w") as err:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=env,
            preexec_fn=_die_with_parent(),
        )
        assert proc.stdin is not None and proc.stdout is not None
        for line in proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue  # something the runtime printed itself
            on_event(event)
            if "checkpoint" in event:  # on_event has flushed the metrics it covers: the worker may keep it
                try:
                    proc.stdin.write("ok\n")
                    proc.stdin.flush()
                except BrokenPipeError:
                    break
        code = proc.wait()
    if code != 0:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        last = lines[-1][:400] if lines else "no message"
        how = f"was killed by signal {-code}" if code < 0 else f"exited with {code}"
        raise WorkerFailed(
            f"the ONNX Runtime training worker {how}: {last} (full log: {log}); fix it and train again, or add "
            "--resume to continue from the last checkpoint"
        )


def _die_with_parent() -> Callable[[], None] | None:
    """Between fork and exec: SIGKILL the worker when pipe dies, however it dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child only calls it
    pr_set_pdeathsig = 1
    return lambda: prctl(pr_set_pdeathsig, signal.SIGKILL)
