"""Training checkpoints: one safetensors file per checkpoint holding weights, best weights and state.

Layout inside the version directory::

    checkpoint/step-000120.safetensors   tensors `weights.*` (the model at that optimizer step),
                                         `best.*` (the best validation epoch so far) and `state.*`
                                         (optimizer moments, RNG states); its metadata holds the
                                         rest of the state as JSON (step, epoch, position in the
                                         epoch, schedule, early-stopping counters, history)
    checkpoint/model.safetensors         the final weights (written when training completes)

A checkpoint is written to a hidden temporary file, fsynced and renamed into place, so a file named
step-*.safetensors is always complete; the newest one is the checkpoint to resume. A SIGKILL at any
moment leaves the previous one current. Nothing is pickled; loading runs no code from the file.
"""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from pipeline.core.errors import ArtifactError
from pipeline.core.fsutil import atomic_path

CHECKPOINT_DIR = "checkpoint"
FINAL_WEIGHTS = "model.safetensors"


def flatten(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Turn nested dicts/lists/tuples holding tensors and arrays into JSON, moving tensors aside."""
    if isinstance(obj, torch.Tensor):
        key = f"t{len(tensors)}"
        tensors[key] = obj.detach().to("cpu").contiguous().clone()
        return {"__tensor__": key}
    if isinstance(obj, np.ndarray):
        key = f"t{len(tensors)}"
        tensors[key] = torch.from_numpy(obj.astype(np.int64) if obj.dtype.kind in "iu" else obj.copy())
        return {"__ndarray__": key, "dtype": obj.dtype.str}
    if isinstance(obj, dict):
        return {"__dict__": [[flatten(k, tensors), flatten(v, tensors)] for k, v in obj.items()]}
    if isinstance(obj, tuple | list):
        if all(type(v) is int for v in obj):  # fast path: python's RNG state is 625 ints
            items = list(obj)
        else:
            items = [flatten(v, tensors) for v in obj]
        return {"__tuple__": items} if isinstance(obj, tuple) else items
    if isinstance(obj, np.generic):
        return obj.item()
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    raise TypeError(f"cannot store {type(obj).__name__} in a checkpoint")


def unflatten(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """The inverse of `flatten`."""
    if isinstance(obj, list):
        return [unflatten(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            return tensors[obj["__tensor__"]]
        if "__ndarray__" in obj:
            return tensors[obj["__ndarray__"]].numpy().astype(obj["dtype"])
        if "__tuple__" in obj:
            return tuple(unflatten(v, tensors) for v in obj["__tuple__"])
        return {unflatten(k, tensors): unflatten(v, tensors) for k, v in obj["__dict__"]}
    return obj


def rng_state() -> dict[str, Any]:
    """Every random generator a training step can touch: python, numpy, torch CPU (and CUDA)."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class CheckpointWriter:
    """Writes checkpoints on a background thread: the loop pays for copying the tensors, not for the disk.

    At most one write is in flight; `submit` waits for the previous one, `wait` for the last one.
    Until a write completes, the previous step-*.safetensors is the newest complete checkpoint.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.last: Path | None = None  # the newest complete checkpoint written by this writer
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(
        self, step: int, weights: dict[str, torch.Tensor], best: dict[str, torch.Tensor], state: dict[str, Any]
    ) -> None:
        self.wait()
        tensors: dict[str, torch.Tensor] = {}
        skeleton = flatten(state, tensors)  # copies every tensor now: training may change them next step
        weights, best = _plain(weights), _plain(best)

        def write() -> None:
            try:
                self.last = _write(self.root, step, weights, best, tensors, skeleton)
            except BaseException as exc:  # handed to the training thread by wait()
                self._error = exc

        self._thread = threading.Thread(target=write, name="pipe-checkpoint")
        self._thread.start()

    def wait(self) -> Path | None:
        """Block until the write in flight is on disk; re-raise its error, if any."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise ArtifactError(f"writing a checkpoint under {self.root / CHECKPOINT_DIR} failed: {error}") from error
        return self.last


def save_checkpoint(
    root: Path, step: int, weights: dict[str, torch.Tensor], best: dict[str, torch.Tensor], state: dict[str, Any]
) -> Path:
    """Write checkpoint/step-<step>.safetensors (synchronously) and return its path."""
    writer = CheckpointWriter(root)
    writer.submit(step, weights, best, state)
    writer.wait()
    return checkpoint_path(root, step)


def checkpoint_path(root: Path, step: int) -> Path:
    return root / CHECKPOINT_DIR / f"step-{step:06d}.safetensors"


def checkpoint_step(path: Path) -> int:
    return int(path.name.removeprefix("step-").removesuffix(".safetensors"))


def _write(
    root: Path,
    step: int,
    weights: dict[str, torch.Tensor],
    best: dict[str, torch.Tensor],
    tensors: dict[str, torch.Tensor],
    skeleton: Any,
) -> Path:
    """One file, written atomically; then older checkpoints and leftovers of killed writes go."""
    path = checkpoint_path(root, step)
    everything = {f"weights.{k}": v for k, v in weights.items()}
    everything |= {f"best.{k}": v for k, v in best.items()}
    everything |= {f"state.{k}": v for k, v in tensors.items()}
    with atomic_path(path) as tmp:
        save_file(everything, tmp, metadata={"state": json.dumps(skeleton)})
    for old in path.parent.glob("*step-*"):
        if old != path:
            old.unlink()  # superseded checkpoints and temp files left by a killed run
    return path


def _plain(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors wants contiguous CPU tensors that share no memory."""
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in weights.items()}


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint file, or None when there is none."""
    found = sorted((root / CHECKPOINT_DIR).glob("step-*.safetensors"), key=checkpoint_step)
    return found[-1] if found else None


_UNREADABLE = (OSError, KeyError, TypeError, ValueError, SafetensorError)  # JSONDecodeError is a ValueError


def read_state(path: Path) -> dict[str, Any]:
    """The JSON part of a checkpoint's state (no tensors): cheap, for checks before resuming."""
    try:
        with safe_open(path, "pt") as f:
            return json.loads(f.metadata()["state"])
    except _UNREADABLE as exc:
        raise _unreadable(path, exc) from None


def load_checkpoint(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, Any]]:
    """(weights, best weights, state) from a checkpoint file written by CheckpointWriter."""
    skeleton = read_state(path)
    try:
        tensors = load_file(path)
    except _UNREADABLE as exc:
        raise _unreadable(path, exc) from None
    parts: dict[str, dict[str, torch.Tensor]] = {"weights": {}, "best": {}, "state": {}}
    for key, value in tensors.items():
        part, _, name = key.partition(".")
        parts[part][name] = value
    return parts["weights"], parts["best"], unflatten(skeleton, parts["state"])


def _unreadable(path: Path, exc: BaseException) -> ArtifactError:
    return ArtifactError(f"checkpoint {path} is unreadable ({exc}); start a fresh run without --resume")
