"""What a training run tells the outside world: metrics.jsonl, TensorBoard, a progress display, MLflow.

Only rank 0 observes; other ranks get a `Monitor` with `enabled=False` whose calls do nothing.
MLflow is optional: used only when the package is installed and MLFLOW_TRACKING_URI is set.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from pipeline.core.fsutil import atomic_write_bytes

METRICS_FILE = "reports/metrics.jsonl"
TENSORBOARD_DIR = "reports/tensorboard"
FLUSH_SECONDS = 2.0  # metrics.jsonl is written at least this often (and before every checkpoint)
TENSORBOARD_TRAIN_EVERY = 10  # optimizer steps between training scalars in TensorBoard (and MLflow)


def plain_output(stream: TextIO = sys.stderr) -> bool:
    """Plain progress lines (no redrawn bar) when the stream is not a terminal or CI is set."""
    return not stream.isatty() or os.environ.get("CI", "").lower() in ("1", "true", "yes")


class Monitor:
    """Fan-out of one run's metrics to every sink; call `close()` at the end."""

    def __init__(self, root: Path, *, enabled: bool, resume_step: int = 0, quiet: bool = False) -> None:
        self.enabled = enabled
        self.quiet = quiet
        self._jsonl: TextIO | None = None
        self._tb: Any = None
        self._mlflow: Any = None
        self._bar: Any = None
        self._last_line = 0.0
        self._pending: list[str] = []  # metrics.jsonl lines not yet written
        self._flushed = time.monotonic()
        if not enabled:
            return
        path = root / METRICS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        _truncate_after(path, resume_step)  # a resumed run rewrites the steps it repeats
        self._jsonl = open(path, "a")
        SummaryWriter = _summary_writer()

        self._tb = SummaryWriter(
            log_dir=str(root / TENSORBOARD_DIR), purge_step=resume_step + 1 if resume_step else None, max_queue=1000
        )  # a resumed run hides the events logged after its checkpoint, then logs them again
        self._mlflow = _mlflow_or_none()

    def log(self, record: dict[str, Any]) -> None:
        """One metrics record: {"kind": "train"|"val"|"test", "step": n, ...numbers}."""
        if self._jsonl is None:
            return
        self._pending.append(json.dumps(record) + "\n")
        if time.monotonic() - self._flushed >= FLUSH_SECONDS:
            self.flush()
        step, kind = record["step"], record["kind"]
        if kind == "train" and step % TENSORBOARD_TRAIN_EVERY:
            return  # TensorBoard's writer costs ~0.5 ms a scalar; metrics.jsonl has every step
        for key, value in record.items():
            if key not in ("kind", "step", "epoch") and isinstance(value, int | float):
                self._tb.add_scalar(f"{kind}/{key}", value, step)
                if self._mlflow is not None:
                    self._mlflow.log_metric(f"{kind}_{key}", value, step=step)

    def progress(
        self, *, epoch: int, epochs: int, step: int, total_steps: int, loss: float, rate: float, eta: float
    ) -> None:
        """Epoch, step, loss, throughput and ETA: a redrawn bar on a terminal, a line every ~5 s otherwise."""
        if not self.enabled or self.quiet:
            return
        text = (
            f"epoch {epoch + 1}/{epochs} step {step}/{total_steps} loss {loss:.4f} {rate:,.0f} samples/s ETA {eta:.0f}s"
        )
        if plain_output():
            now = time.monotonic()
            if now - self._last_line >= 5.0 or step == total_steps:
                print(text, file=sys.stderr, flush=True)
                self._last_line = now
            return
        if self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, initial=step, unit="step", dynamic_ncols=True, leave=False)
        self._bar.n = step
        self._bar.set_description_str(f"epoch {epoch + 1}/{epochs}")
        self._bar.set_postfix_str(f"loss {loss:.4f} {rate:,.0f} samples/s ETA {eta:.0f}s")

    def flush(self) -> None:
        """Write pending metrics.jsonl lines; the loop calls it before each checkpoint, so every step a
        checkpoint covers is on disk before the checkpoint is."""
        if self._jsonl is not None and self._pending:
            self._jsonl.write("".join(self._pending))
            self._jsonl.flush()
            self._pending.clear()
        self._flushed = time.monotonic()

    def message(self, text: str) -> None:
        """An event worth a line of its own (epoch summary, early stop, checkpoint)."""
        if not self.enabled or self.quiet:
            return
        if self._bar is not None:
            self._bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._tb is not None:
            self._tb.close()
        if self._jsonl is not None:
            self.flush()
            self._jsonl.close()
        if self._mlflow is not None:
            self._mlflow.end_run()


def _summary_writer() -> Any:
    """torch's SummaryWriter, without TensorFlow.

    TensorBoard's writer imports TensorFlow when it is installed (3 s and hundreds of MB, for file
    I/O it has a built-in stub for). Its own switch for the stub is the presence of the module
    `tensorboard.compat.notf` (what its Bazel target `no_tensorflow` adds); we register that marker.
    """
    import types

    sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter


def _truncate_after(path: Path, step: int) -> None:
    """Keep only records up to `step` (all of them when starting fresh at 0 and the file is new).

    A run killed mid-write can leave a torn last line; it is after the checkpoint (metrics are
    flushed before each one), so it goes with the other records being replayed.
    """
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["step"] <= step:
                kept.append(line + "\n")
        except (ValueError, KeyError, TypeError):
            continue
    atomic_write_bytes(path, "".join(kept).encode())  # a kill now leaves the old file, not half of it


def _mlflow_or_none() -> Any:
    """The mlflow module with a started run, when installed and configured; otherwise None."""
    if not os.environ.get("MLFLOW_TRACKING_URI"):
        return None
    try:
        import mlflow  # optional: never a dependency
    except ImportError:
        return None
    mlflow.start_run()
    return mlflow
