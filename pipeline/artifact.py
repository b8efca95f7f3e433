"""The artifact contract: a versioned directory with a manifest that every stage reads and extends.

Layout (DESIGN.md section 1)::

    artifacts/<name>/<version>/manifest.json   the contract below
                               model.onnx      fp32 ONNX, the artifact
                               golden.npz      real inputs + reference outputs
                               checkpoint/ variants/ edge/ reports/

Loading verifies the sha256 and size of every file the manifest lists; saving is atomic. Only the
standard library and this package are imported here, so the server and the CLI load it cheaply.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from pipeline import __version__
from pipeline.errors import ArtifactError
from pipeline.fsutil import atomic_write_bytes, sha256_file

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"
TASKS = ("classification", "regression", "embedding")


@dataclass
class TensorSpec:
    """One model input or output as the outside world sees it."""

    name: str
    dtype: str  # numpy dtype name: "float32", "int64", ...
    shape: list[int | str]  # symbolic dims are names, e.g. ["batch", 64] or ["batch", "sequence"]
    layout: str = "NC"  # NC (features), NCHW / NHWC (images), NT (token sequences)
    preprocessing: dict[str, Any] = field(default_factory=dict)  # e.g. {"mean": [...], "std": [...]}


@dataclass
class FileEntry:
    """What a listed file must hash to; anything else is a tampered or truncated artifact."""

    sha256: str
    size: int


@dataclass
class Lineage:
    """Where the model came from, so two artifacts can be told apart and reproduced."""

    recipe_digest: str | None = None  # sha256 of the recipe file the run used
    dataset_fingerprint: str | None = None  # sha256 of the data content (features + labels)
    code_version: str = __version__  # pipe version that wrote the artifact
    parent_digest: str | None = None  # identity digest of the artifact this one derives from
    backend: str | None = None  # torch | ort | import
    seed: int | None = None


@dataclass
class Variant:
    """A derived form of model.onnx (optimized, quantized, TFLite) and how it compares."""

    file: str  # relative path inside the artifact, e.g. "variants/model.int8.onnx"
    precision: str  # fp32 | fp16 | int8 | ...
    format: str  # onnx | tflite
    metrics: dict[str, float] = field(default_factory=dict)
    parity: dict[str, Any] = field(default_factory=dict)  # against model.onnx on golden inputs
    latency_ms: float | None = None
    size: int | None = None


@dataclass
class Manifest:
    """manifest.json: the contract between stages."""

    name: str
    version: int
    task: str  # one of TASKS
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    labels: list[str] = field(default_factory=list)
    lineage: Lineage = field(default_factory=Lineage)
    files: dict[str, FileEntry] = field(default_factory=dict)  # relative path -> expected content
    variants: dict[str, Variant] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)  # eval metrics of the trained model
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)  # per-stage records (train, export...)
    created: str = field(default_factory=lambda: _dt.datetime.now(_dt.UTC).isoformat())
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = MANIFEST_NAME) -> Manifest:
        """Build a manifest from parsed JSON, naming any missing, unknown or mistyped field."""
        if not isinstance(data, dict):
            raise ArtifactError(f"{source}: expected a JSON object, got {type(data).__name__}")
        found = data.get("schema_version")
        if not isinstance(found, int) or found > SCHEMA_VERSION:
            raise ArtifactError(
                f"{source}: schema_version {found!r} is not supported by pipe {__version__} "
                f"(it reads up to {SCHEMA_VERSION}); upgrade pipe or re-create the artifact"
            )
        try:
            fields = _check_keys(cls, data, source)
            fields["inputs"] = [_build(TensorSpec, t, f"{source}: inputs") for t in data["inputs"]]
            fields["outputs"] = [_build(TensorSpec, t, f"{source}: outputs") for t in data["outputs"]]
            fields["lineage"] = _build(Lineage, data.get("lineage", {}), f"{source}: lineage")
            fields["files"] = {
                k: _build(FileEntry, v, f"{source}: files.{k}") for k, v in data.get("files", {}).items()
            }
            fields["variants"] = {
                k: _build(Variant, v, f"{source}: variants.{k}") for k, v in data.get("variants", {}).items()
            }
        except (TypeError, AttributeError) as exc:
            raise ArtifactError(f"{source}: malformed manifest ({exc}); re-create the artifact") from exc
        manifest = cls(**fields)
        _check_scalars(manifest, source)
        if manifest.task not in TASKS:
            raise ArtifactError(f"{source}: task {manifest.task!r} is not one of {', '.join(TASKS)}")
        for rel in manifest.files:
            check_relative(rel)
        return manifest

    def identity_digest(self) -> str:
        """sha256 of what identifies the model (not files, metrics or variants, which later stages add).

        Stamped into model.onnx's metadata so a model file can be matched to its manifest.
        """
        ident = {k: v for k, v in self.to_dict().items() if k in _IDENTITY_FIELDS}
        return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()


_IDENTITY_FIELDS = ("name", "version", "task", "inputs", "outputs", "labels", "lineage", "created")


def _check_scalars(manifest: Manifest, source: str) -> None:
    """The top-level values readers index and compare must have their declared types."""
    wrong = [
        f"{key} must be {kind}, got {value!r}"
        for key, value, kind, ok in (
            ("name", manifest.name, "a string", isinstance(manifest.name, str)),
            ("version", manifest.version, "an integer", type(manifest.version) is int),
            ("created", manifest.created, "a string", isinstance(manifest.created, str)),
            ("labels", manifest.labels, "a list of strings", _all(manifest.labels, list, str)),
            ("metrics", manifest.metrics, "an object of numbers", _numbers(manifest.metrics)),
        )
        if not ok
    ]
    if wrong:
        raise ArtifactError(f"{source}: " + "; ".join(wrong))


def _all(value: Any, container: type, item: type) -> bool:
    return isinstance(value, container) and all(isinstance(v, item) for v in value)


def _numbers(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in value.values()
    )


def _check_keys(cls: type, data: dict[str, Any], where: str) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    required = {
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    unknown = sorted(set(data) - names)
    missing = sorted(required - set(data))
    problems = []
    if unknown:
        problems.append(f"unknown key(s) {unknown}")
    if missing:
        problems.append(f"missing key(s) {missing}")
    if problems:
        raise ArtifactError(f"{where}: {'; '.join(problems)}")
    return dict(data)


def _build(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise ArtifactError(f"{where}: expected an object, got {data!r}")
    return cls(**_check_keys(cls, data, where))


def check_relative(rel: str) -> PurePosixPath:
    """Refuse a manifest path that could point outside the artifact directory."""
    path = PurePosixPath(rel)
    if path.is_absolute() or rel.startswith(("/", "\\")) or ".." in path.parts or not path.parts:
        raise ArtifactError(
            f"path {rel!r} escapes the artifact directory; manifest paths must be relative and "
            "stay inside it (no '..', no absolute paths)"
        )
    return path


class Artifact:
    """An artifact directory and its manifest. Stages add files and variants, then `save()`."""

    def __init__(self, root: Path, manifest: Manifest) -> None:
        self.root = Path(root)
        self.manifest = manifest

    @classmethod
    def load(cls, root: str | Path, verify: bool = True) -> Artifact:
        """Read `root/manifest.json`; with `verify`, refuse any listed file that does not match."""
        root = Path(root)
        path = root / MANIFEST_NAME
        if not path.is_file():
            hint = ""
            if root.is_dir() and any(p.name.isdigit() for p in root.iterdir()):
                hint = f" (it holds versions: pass {root}/<version>, or use resolve_artifact)"
            raise ArtifactError(f"{root} is not an artifact: {MANIFEST_NAME} not found{hint}")
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ArtifactError(f"{path}: not valid JSON ({exc}); the manifest is corrupt") from exc
        artifact = cls(root, Manifest.from_dict(data, str(path)))
        if verify:
            artifact.verify()
        return artifact

    def path(self, rel: str) -> Path:
        """Absolute path of a file inside the artifact, refusing anything that leaves it."""
        check_relative(rel)
        full = self.root / rel
        real_root = self.root.resolve()
        real = full.resolve()
        if real != real_root and real_root not in real.parents:
            raise ArtifactError(f"{rel!r} resolves to {real}, outside the artifact {real_root} (symlink?)")
        return full

    def verify(self) -> None:
        """Check every listed file's size and sha256; collect all problems, then raise once."""
        problems = []
        for rel, entry in sorted(self.manifest.files.items()):
            try:
                full = self.path(rel)
            except ArtifactError as exc:
                problems.append(str(exc))
                continue
            if not full.is_file():
                problems.append(f"{rel}: missing")
            elif (size := full.stat().st_size) != entry.size:
                problems.append(f"{rel}: size {size} bytes, manifest says {entry.size} (truncated or replaced)")
            elif sha256_file(full) != entry.sha256:
                problems.append(f"{rel}: sha256 does not match the manifest (modified after it was written)")
        if problems:
            raise ArtifactError(
                f"artifact {self.root} failed verification; it was tampered with or damaged. "
                "Re-create it with the stage that wrote these files:\n  " + "\n  ".join(problems)
            )

    def add_file(self, rel: str) -> FileEntry:
        """Record a file already written inside the artifact (hash and size) in the manifest."""
        full = self.path(rel)
        if not full.is_file():
            raise ArtifactError(f"cannot add {rel!r} to the manifest: {full} is not a file")
        entry = FileEntry(sha256=sha256_file(full), size=full.stat().st_size)
        self.manifest.files[str(PurePosixPath(rel))] = entry
        return entry

    def write_file(self, rel: str, data: bytes) -> FileEntry:
        """Write bytes atomically inside the artifact and record them."""
        atomic_write_bytes(self.path(rel), data)
        return self.add_file(rel)

    def remove_file(self, rel: str) -> None:
        """Forget a file and delete it (e.g. an export that failed its gate)."""
        self.manifest.files.pop(rel, None)
        full = self.path(rel)
        if full.is_file():
            full.unlink()

    def add_variant(self, name: str, variant: Variant) -> None:
        """Record a derived model; its file must already be inside the artifact."""
        self.add_file(variant.file)
        if variant.size is None:
            variant.size = self.manifest.files[variant.file].size
        self.manifest.variants[name] = variant

    def save(self) -> None:
        """Write manifest.json atomically: a crash leaves the previous manifest intact."""
        self.root.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.manifest.to_dict(), indent=2, sort_keys=False) + "\n"
        atomic_write_bytes(self.root / MANIFEST_NAME, text.encode())

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def version(self) -> int:
        return self.manifest.version


def versions(model_root: Path) -> list[int]:
    """Version numbers under artifacts/<name>/ that hold a manifest, ascending."""
    model_root = Path(model_root)
    if not model_root.is_dir():
        return []
    return sorted(int(p.name) for p in model_root.iterdir() if p.name.isdigit() and (p / MANIFEST_NAME).is_file())


def allocate_version(model_root: Path) -> Path:
    """Create and return the next free version directory (1, 2, 3 ...); safe against races."""
    model_root = Path(model_root)
    model_root.mkdir(parents=True, exist_ok=True)
    taken = [int(p.name) for p in model_root.iterdir() if p.name.isdigit()]
    number = max(taken, default=0) + 1
    while True:
        candidate = model_root / str(number)
        try:
            os.mkdir(candidate)
            return candidate
        except FileExistsError:
            number += 1


def resolve_artifact(path: str | Path) -> Path:
    """Accept `artifacts/<name>/<version>` or `artifacts/<name>` (its latest version)."""
    path = Path(path)
    if (path / MANIFEST_NAME).is_file():
        return path
    if not path.exists():
        raise ArtifactError(f"artifact {path} does not exist; pass artifacts/<name>[/<version>]")
    found = versions(path)
    if not found:
        raise ArtifactError(f"{path} holds no artifact: no {MANIFEST_NAME} in it or in a numbered version under it")
    return path / str(found[-1])
