"""Version labels of a model: `artifacts/<name>/labels.json`, e.g. `{"stable": 3, "canary": 4}`.

TF Serving's idea: a label names the version a client reaches without naming a number. `pipe
promote artifacts/<name>/<N> [--label stable]` sets one (atomically; `pipe serve` rereads the file
on every scan), and the server answers `/v1/models/<name>/labels/<label>...` and
`/v2/models/<name>/labels/<label>/...` with the labelled version. A model with a `stable` label
answers unversioned requests with that version rather than the newest one, so a new version
directory never takes traffic before it is promoted; `pipe serve --versions promoted` serves only
labelled versions at all (docs/http-api.md, "Which versions are served").

The file sits beside the version directories, not in one: a label is a statement about the model,
and moving it must not touch (or re-hash) any version. Its read-change-replace holds the model
directory's lock file (`locked`, the one the stages take on a version), so promotes running at once
each keep their label. A reader (the server, every scan) takes no lock: the replace is atomic. It
refuses, by `stat` before reading, anything but a regular file of at most `MAX_BYTES` (a FIFO would
block the reader; a file of megabytes holds it for seconds), and JSON nested past what a label file
needs, each as one ArtifactError naming the file.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

from pipeline.artifact.directory import locked
from pipeline.core.errors import ArtifactError, InputError
from pipeline.core.fsutil import atomic_write_bytes

LABELS_NAME = "labels.json"
STABLE = "stable"  # the label unversioned requests follow when a model has it
LABEL = re.compile(r"[a-z][a-z0-9_-]{0,63}")  # starts with a letter: never mistaken for a version number
LABEL_RULE = "1-64 characters of a-z, 0-9, '-' and '_', starting with a letter (stable, canary)"
MAX_VERSION = 999_999_999  # a version directory name has at most 9 digits
MAX_BYTES = 64 * 1024  # the largest labels file read: ~1,000 labels of 64 characters


def check_label(label: str) -> str:
    """`label` when it is a valid label name, else InputError with the rule."""
    if not LABEL.fullmatch(label):
        raise InputError(f"label {label[:70]!r} is not a label name; use {LABEL_RULE}")
    return label


def read_labels(model_root: Path) -> dict[str, int]:
    """The model's labels (empty without a labels file); ArtifactError naming the file when it is not a
    regular file of at most MAX_BYTES, or is malformed."""
    path = Path(model_root) / LABELS_NAME
    try:
        # O_NONBLOCK: opening a FIFO for reading must not wait for a writer; fstat then refuses it
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ArtifactError(f"{path}: cannot read it ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ArtifactError(f"{path} is not a regular file; remove it and set labels with `pipe promote`")
        raw = file.read(MAX_BYTES + 1) if info.st_size <= MAX_BYTES else b""
    if info.st_size > MAX_BYTES or len(raw) > MAX_BYTES:  # the size first: a large file is never read
        raise ArtifactError(
            f"{path} holds {max(info.st_size, len(raw))} bytes, more than a labels file's {MAX_BYTES}; rewrite "
            'it with `pipe promote` (it holds label -> version, e.g. {"stable": 3})'
        )
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{path} is not valid JSON ({exc}); rewrite it with `pipe promote`") from None
    except RecursionError:
        raise ArtifactError(
            f"{path} is nested too deeply to be label -> version; rewrite it with `pipe promote`"
        ) from None
    if not isinstance(data, dict):
        raise ArtifactError(f'{path} must be an object of label -> version, e.g. {{"stable": 3}}; got {data!r:.80}')
    for label, version in data.items():
        if not isinstance(label, str) or not LABEL.fullmatch(label):
            raise ArtifactError(f"{path}: {label!r:.70} is not a label name; use {LABEL_RULE}")
        if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= MAX_VERSION:
            raise ArtifactError(f"{path}: label {label!r} must name a version number >= 1, got {version!r:.40}")
    return data


def write_label(model_root: Path, label: str, version: int | None) -> int | None:
    """Point `label` at `version` (None: remove it); returns the version it named before, if any.

    Read, changed and replaced under the model directory's lock: two promotes at once take turns,
    and neither loses the other's label."""
    check_label(label)
    with locked(model_root):
        labels = read_labels(model_root)
        previous = labels.pop(label, None)
        if version is not None:
            labels[label] = version
        text = json.dumps(dict(sorted(labels.items())), indent=2) + "\n"
        atomic_write_bytes(Path(model_root) / LABELS_NAME, text.encode())
    return previous
