"""The version directory an import writes into, removed again when the import fails.

    with new_version(repository, name) as root:
        ...write model.onnx, gate it, save the manifest...

Every `pipe import` (an ONNX file, an encoder, a causal LM) leaves nothing behind on failure: the new
version directory is removed, and so are the model and repository directories the import made.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

from pipeline.artifact.directory import allocate_version


@contextlib.contextmanager
def new_version(repository: Path, name: str) -> Iterator[Path]:
    """`repository/<name>/<next version>/`, made; on any failure inside the block it is removed, and so is
    a model or repository directory this call made, unless another import filled it meanwhile."""
    model_root = Path(repository) / name
    made = [d for d in (model_root, model_root.parent) if not d.exists()]
    root = allocate_version(model_root)
    try:
        yield root
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)  # nothing half-written
        for directory in made:
            with contextlib.suppress(OSError):
                directory.rmdir()
        raise
