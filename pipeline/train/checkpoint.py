"""Training checkpoints: weights as safetensors, the rest of the state as safetensors + JSON.

Layout inside the version directory::

    checkpoint/step-000120/weights.safetensors  model weights at that optimizer step
                           best.safetensors     weights of the best validation epoch so far
                           state.safetensors    every tensor of the optimizer and RNG states
                           state.json           step, epoch, position, schedule, history, and the
                                                structure that puts the tensors back together
    checkpoint/latest.json                      {"dir": "step-000120"}: the checkpoint to resume
    checkpoint/model.safetensors                the final weights (written when training completes)

A checkpoint is written into a hidden temporary folder and renamed into place, then `latest.json`
is replaced atomically: a SIGKILL at any moment leaves the previous complete checkpoint current.
Nothing is pickled; loading runs no code from the file.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from pipeline.errors import ArtifactError
from pipeline.fsutil import atomic_write_bytes, fsync_dir

CHECKPOINT_DIR = "checkpoint"
LATEST = "latest.json"
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
    if isinstance(obj, tuple):
        return {"__tuple__": [flatten(v, tensors) for v in obj]}
    if isinstance(obj, list):
        return [flatten(v, tensors) for v in obj]
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


def save_checkpoint(
    root: Path, step: int, weights: dict[str, torch.Tensor], best: dict[str, torch.Tensor], state: dict[str, Any]
) -> Path:
    """Write checkpoint/step-<step>/ completely, then point latest.json at it; drop older ones."""
    ckpt = root / CHECKPOINT_DIR
    ckpt.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=ckpt))
    try:
        tensors: dict[str, torch.Tensor] = {}
        skeleton = flatten(state, tensors)
        save_file(_plain(weights), tmp / "weights.safetensors")
        save_file(_plain(best), tmp / "best.safetensors")
        save_file(tensors, tmp / "state.safetensors")
        (tmp / "state.json").write_text(json.dumps(skeleton))
        for f in tmp.iterdir():
            with open(f, "rb") as handle:
                os.fsync(handle.fileno())
        final = ckpt / name
        if final.exists():  # the same step saved twice (a step boundary at epoch end)
            shutil.rmtree(final)
        os.rename(tmp, final)
        fsync_dir(ckpt)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    atomic_write_bytes(ckpt / LATEST, json.dumps({"dir": name, "step": step}).encode())
    for old in ckpt.iterdir():
        if old.is_dir() and old.name != name:
            shutil.rmtree(old)  # superseded checkpoints and temp folders left by a killed run
    return final


def _plain(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors wants contiguous CPU tensors that share no memory."""
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in weights.items()}


def latest_checkpoint(root: Path) -> Path | None:
    """The complete checkpoint latest.json points at, or None when there is none."""
    pointer = root / CHECKPOINT_DIR / LATEST
    if not pointer.is_file():
        return None
    try:
        found = root / CHECKPOINT_DIR / json.loads(pointer.read_text())["dir"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ArtifactError(f"{pointer} is corrupt ({exc}); start a fresh run without --resume") from None
    if not (found / "state.json").is_file():
        raise ArtifactError(f"{pointer} points at {found}, which is incomplete; start a fresh run without --resume")
    return found


def load_checkpoint(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, Any]]:
    """(weights, best weights, state) from a checkpoint folder written by save_checkpoint."""
    state = unflatten(json.loads((path / "state.json").read_text()), load_file(path / "state.safetensors"))
    return load_file(path / "weights.safetensors"), load_file(path / "best.safetensors"), state
