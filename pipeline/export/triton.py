"""`pipe export --target triton`: the same model.onnx as a Triton Inference Server model repository.

    OUT/<name>/config.pbtxt          platform onnxruntime_onnx, inputs/outputs/dims, batching
    OUT/<name>/labels.txt            class names (classification), referenced by the first output
    OUT/<name>/<version>/model.onnx  byte-for-byte the artifact's verified model (+ external data)

A model whose inputs and outputs all lead with a symbolic batch dim gets `max_batch_size` and
dynamic batching, and its dims are written without the batch axis (Triton's convention); other
symbolic dims become -1. No `instance_group` is written unless an instance kind is asked for
(`--instance-kind cpu|gpu`): Triton then places one instance per GPU when it has GPUs, else on CPU.
The text is Triton's protobuf text format; the tests parse it with the ModelConfig message shipped
in tritonclient. Everything written gets the modes `mkdir` and `open` would give (0755 and 0644
under the usual umask), so a Triton container running as another user can read it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from pipeline.artifact.directory import Artifact
from pipeline.artifact.tensors import TensorSpec
from pipeline.artifact.variants import MODEL_FILE
from pipeline.core.errors import ArtifactError, InputError
from pipeline.core.fsutil import atomic_write_bytes
from pipeline.export.graph import load_graph
from pipeline.export.metadata import identity
from pipeline.runtime.external_data import external_files

DEFAULT_MAX_BATCH = 64
INSTANCE_KINDS = {"cpu": "KIND_CPU", "gpu": "KIND_GPU"}  # --instance-kind -> Triton's instance_group kind
TRITON_TYPES = {
    "bool": "TYPE_BOOL",
    "uint8": "TYPE_UINT8",
    "uint16": "TYPE_UINT16",
    "uint32": "TYPE_UINT32",
    "uint64": "TYPE_UINT64",
    "int8": "TYPE_INT8",
    "int16": "TYPE_INT16",
    "int32": "TYPE_INT32",
    "int64": "TYPE_INT64",
    "float16": "TYPE_FP16",
    "float32": "TYPE_FP32",
    "float64": "TYPE_FP64",
    "bfloat16": "TYPE_BF16",
    "str": "TYPE_STRING",
    "object": "TYPE_STRING",
}


def batchable(artifact: Artifact) -> bool:
    """True when every input and output leads with a symbolic (batch) dim."""
    specs = [*artifact.manifest.inputs, *artifact.manifest.outputs]
    return all(s.shape and isinstance(s.shape[0], str) for s in specs)


def _tensor(spec: TensorSpec, batched: bool, label_file: str | None = None) -> str:
    if spec.dtype not in TRITON_TYPES:
        raise InputError(
            f"{spec.name!r} has dtype {spec.dtype!r}, which Triton has no type for; Triton takes {sorted(TRITON_TYPES)}"
        )
    dims = spec.shape[1:] if batched else spec.shape
    text = ", ".join(str(d) if isinstance(d, int) else "-1" for d in dims)
    lines = [
        f"    name: {pbtxt_string(spec.name)}",
        f"    data_type: {TRITON_TYPES[spec.dtype]}",
        f"    dims: [ {text} ]",
    ]
    if label_file:
        lines.append(f"    label_filename: {pbtxt_string(label_file)}")
    return "  {\n" + "\n".join(lines) + "\n  }"


def config_text(artifact: Artifact, max_batch_size: int = DEFAULT_MAX_BATCH, instance_kind: str | None = None) -> str:
    """config.pbtxt for the artifact's model.onnx; `instance_kind` (cpu|gpu) pins where Triton runs it."""
    if instance_kind is not None and instance_kind not in INSTANCE_KINDS:
        raise InputError(f"instance kind {instance_kind!r} is not one of {sorted(INSTANCE_KINDS)} (or omit it)")
    manifest = artifact.manifest
    batched = batchable(artifact)
    labels = "labels.txt" if manifest.labels and manifest.task == "classification" else None
    inputs = ",\n".join(_tensor(s, batched) for s in manifest.inputs)
    outputs = ",\n".join(_tensor(s, batched, labels if i == 0 else None) for i, s in enumerate(manifest.outputs))
    parameters = "".join(
        f"parameters {{\n  key: {pbtxt_string(key)}\n  value {{ string_value: {pbtxt_string(value)} }}\n}}\n"
        for key, value in identity(manifest).items()
    )
    instances = (
        f"instance_group [\n  {{\n    count: 1\n    kind: {INSTANCE_KINDS[instance_kind]}\n  }}\n]\n"
        if instance_kind
        else ""  # Triton's default: an instance per GPU when it has GPUs, else on CPU
    )
    return (
        f"name: {pbtxt_string(manifest.name)}\n"
        'platform: "onnxruntime_onnx"\n'
        f"default_model_filename: {pbtxt_string(MODEL_FILE)}\n"
        f"max_batch_size: {max_batch_size if batched else 0}\n"
        f"input [\n{inputs}\n]\n"
        f"output [\n{outputs}\n]\n"
        + ("dynamic_batching {\n  max_queue_delay_microseconds: 100\n}\n" if batched else "")
        + instances
        + parameters
    )


def pbtxt_string(value: str) -> str:
    """`value` as a protobuf text-format string literal: quoted, with quotes, backslashes, newlines and every
    other non-printable byte escaped by protobuf's own escaper, so a tensor name can never end the string
    and add a field (`" data_type: TYPE_STRING`) or break the file (a newline)."""
    from google.protobuf import text_encoding

    return '"' + text_encoding.CEscape(value, as_utf8=True) + '"'


def _directory_mode() -> int:
    """The mode `mkdir` gives a new directory here: 0777 less the umask (0755 under the usual 022)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o777 & ~umask


def write_repository(
    artifact: Artifact, out: Path, max_batch_size: int = DEFAULT_MAX_BATCH, instance_kind: str | None = None
) -> Path:
    """Write (or update) `out/<name>/` for the artifact's model.onnx; returns the model directory.

    The version directory is assembled beside its final place and renamed in, so Triton polling the
    repository never sees half a model; an existing copy of the same version is replaced.
    """
    if max_batch_size < 1:
        raise InputError(f"max batch size must be at least 1, got {max_batch_size}")
    if MODEL_FILE not in artifact.manifest.files:
        raise ArtifactError(
            f"artifact {artifact.root} has no {MODEL_FILE} yet; run `pipe export {artifact.root}` first "
            "(or `pipe import` for an ONNX model made elsewhere)"
        )
    model_dir = Path(out) / artifact.name
    _refuse_overlap(artifact, Path(out), model_dir)
    config = config_text(artifact, max_batch_size, instance_kind)
    model_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{artifact.version}.", dir=model_dir))
    staging.chmod(_directory_mode())  # mkdtemp makes it owner-only (0700); it becomes the version directory
    try:
        weights = external_files(load_graph(artifact.path(MODEL_FILE)), artifact.root)
        for rel in [MODEL_FILE, *weights]:
            target = staging / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(artifact.path(rel), target)
        final = model_dir / str(artifact.version)
        if final.exists():
            _refuse_foreign(final, {MODEL_FILE, *weights})
            shutil.rmtree(final)
        staging.rename(final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if artifact.manifest.labels and artifact.manifest.task == "classification":
        atomic_write_bytes(model_dir / "labels.txt", ("\n".join(artifact.manifest.labels) + "\n").encode())
    else:
        (model_dir / "labels.txt").unlink(missing_ok=True)  # the new config references none: drop a stale one
    atomic_write_bytes(model_dir / "config.pbtxt", config.encode())
    return model_dir


def _refuse_overlap(artifact: Artifact, out: Path, model_dir: Path) -> None:
    """Refuse, before anything is written, an output that is a file or that overlaps the source artifact's
    model directory (the repository holding it, the model directory, the artifact or a directory inside
    them): the Triton version directory written there would replace a pipe version."""
    for path in (out, model_dir):
        if path.exists() and not path.is_dir():
            raise InputError(f"--out {out}: {path} is a file, not a directory; give a directory for the repository")
    source, target = artifact.root.parent.resolve(), model_dir.resolve()  # pipe's model directory: every version
    if source.is_relative_to(target) or target.is_relative_to(source):
        raise InputError(
            f"--out {out} overlaps the artifact {artifact.root} (the Triton model directory would be {model_dir}); "
            "write the Triton repository somewhere outside pipe's artifacts, e.g. --out triton-models"
        )


def _refuse_foreign(version_dir: Path, written: set[str]) -> None:
    """A version directory is replaced only when it holds what an earlier Triton export wrote: nothing else."""
    foreign = sorted(
        str(p.relative_to(version_dir)) for p in version_dir.rglob("*") if p.is_file() and
        str(p.relative_to(version_dir)) not in written
    )  # fmt: skip
    if foreign or not version_dir.is_dir():
        shown = ", ".join(foreign[:5]) or "not a directory"
        raise InputError(
            f"{version_dir} exists and holds files a Triton export did not write ({shown}); pipe replaces only its "
            "own version directories: move it away or choose another --out"
        )
