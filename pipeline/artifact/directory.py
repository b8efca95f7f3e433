"""The artifact: a versioned directory holding a manifest that every stage reads and extends.

Layout (docs/artifact.md)::

    artifacts/<name>/<version>/manifest.json   the contract (pipeline/artifact/manifest.py)
                               model.onnx      fp32 ONNX, the artifact
                               golden.npz      real inputs + reference outputs
                               checkpoint/ variants/ edge/ reports/

Loading refuses, with one line saying why, every manifest that does not parse or validate, a
manifest or version directory that is a symlink leading out of its place, a version directory
whose name is not plain ASCII digits or disagrees with the manifest, and any listed file whose
sha256 or size does not match. Saving is atomic. Only the standard library and this package are
imported here, so the server and the CLI load it cheaply.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Collection, Iterator
from pathlib import Path, PurePosixPath

from pipeline.artifact.manifest import MANIFEST_NAME, FileEntry, Manifest, check_name, check_relative
from pipeline.artifact.variants import Variant
from pipeline.core.errors import ArtifactError, first_line
from pipeline.core.fsutil import atomic_write_bytes, sha256_file

LOCK_NAME = ".lock"  # stages writing to one version at once take turns on this file


class Artifact:
    """An artifact directory and its manifest. Stages add files and variants, then `save()`."""

    def __init__(self, root: Path, manifest: Manifest) -> None:
        self.root = Path(root)
        self.manifest = manifest

    @classmethod
    def load(cls, root: str | Path, verify: bool = True, replacing: Collection[str] = ()) -> Artifact:
        """Read `root/manifest.json`; with `verify`, refuse any listed file that does not match.

        `replacing`: files the caller (a stage) is about to write anew and never reads, left out of
        the check, so a stage interrupted between moving its files and saving the manifest can be
        run again to repair the version instead of being refused by its own half-written output.
        """
        root = Path(root)
        path = root / MANIFEST_NAME
        if not path.is_file():
            hint = ""
            if root.is_dir() and version_dirs(root):
                hint = f" (it holds versions: pass {root}/<version>)"
            raise ArtifactError(f"{root} is not an artifact: {MANIFEST_NAME} not found{hint}")
        _check_place(root)
        # Verifying reads the manifest and checks the files under one shared lock: a stage committing
        # in between would otherwise pair the old manifest with its new files ("tampered").
        with locked(root, shared=True) if verify else contextlib.nullcontext():
            manifest = _read_manifest(path)
            _check_identity(root, manifest)
            artifact = cls(root, manifest)
            if verify:
                artifact.verify(skip=replacing)
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

    def verify(self, skip: Collection[str] = ()) -> None:
        """Check every listed file's size and sha256 (but `skip`); collect all problems, then raise once."""
        problems = []
        for rel, entry in sorted(self.manifest.files.items()):
            if rel in skip:
                continue
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
        """Record a model file as a variant; the file must already be inside the artifact."""
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


def _read_manifest(path: Path) -> Manifest:
    try:
        data = json.loads(path.read_bytes())
    except RecursionError:
        raise ArtifactError(f"{path}: nested too deeply to be a manifest; the manifest is corrupt") from None
    except ValueError as exc:  # bad JSON, bad UTF-8, or an integer too long to convert
        raise ArtifactError(f"{path}: not valid JSON ({first_line(exc, 200)}); the manifest is corrupt") from None
    return Manifest.from_dict(data, str(path))


def is_version_name(name: str) -> bool:
    """A version directory is named 1, 2, 3 ... in ASCII digits ('²' is a digit to Python, not a version)."""
    return 0 < len(name) <= 9 and name.isascii() and name.isdigit() and name[0] != "0"


def _check_place(root: Path) -> None:
    """Refuse a manifest or version directory that is a symlink leading out of its place."""
    manifest = root / MANIFEST_NAME
    real_root = root.resolve()
    if manifest.is_symlink() and real_root not in manifest.resolve().parents:
        raise ArtifactError(
            f"{manifest} is a symlink to {manifest.resolve()}, outside the artifact; "
            "a manifest must be a file inside its version directory"
        )
    absolute = Path(os.path.abspath(root))
    if root.is_symlink() and real_root.parent != absolute.parent.resolve():
        raise ArtifactError(
            f"version directory {root} is a symlink to {real_root}, outside {absolute.parent}; "
            "move the artifact into the model directory instead of linking it"
        )


def _check_identity(root: Path, manifest: Manifest) -> None:
    """The directories say which model and version this is (as in Triton); the manifest must agree."""
    absolute = Path(os.path.abspath(root))
    if not is_version_name(absolute.name):
        raise ArtifactError(
            f"{root}: {absolute.name[:40]!r} is not a version directory name; an artifact lives in "
            "<name>/<N> with N in ASCII digits (1, 2, 3 ...)"
        )
    if (absolute.parent.name, absolute.name) != (manifest.name, str(manifest.version)):
        raise ArtifactError(
            f"{root}: the manifest says {manifest.name} v{manifest.version} but the directory is "
            f"{absolute.parent.name}/{absolute.name}; move the artifact to <name>/<version> matching its manifest"
        )


@contextlib.contextmanager
def locked(root: Path, shared: bool = False) -> Iterator[None]:
    """Hold the artifact's lock file: exclusive for a stage's write, shared for a reader's verify.

    A reader creates the lock file too when it is missing, so a stage that creates it a moment later
    still waits for the reader; only where it cannot be created (a read-only artifact: nothing can
    be writing it) does a reader go without.
    """
    path = Path(root) / LOCK_NAME
    try:
        fd = os.open(path, (os.O_RDONLY if shared else os.O_RDWR) | os.O_CREAT, 0o666)
    except OSError:
        if shared and not path.exists():
            yield
            return
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def version_dirs(model_root: Path) -> dict[int, Path]:
    """The one scan of a model directory: version number -> directory, for each `<N>/manifest.json`.

    Only ASCII-digit names count (see `is_version_name`); a directory still being written (no
    manifest yet) is not listed.
    """
    model_root = Path(model_root)
    if not model_root.is_dir():
        return {}
    found = {int(p.name): p for p in model_root.iterdir() if is_version_name(p.name) and (p / MANIFEST_NAME).is_file()}
    return dict(sorted(found.items()))


def versions(model_root: Path) -> list[int]:
    """Version numbers under artifacts/<name>/ that hold a manifest, ascending."""
    return list(version_dirs(model_root))


def allocate_version(model_root: Path) -> Path:
    """Create and return the next free version directory (1, 2, 3 ...); safe against races."""
    model_root = Path(model_root)
    if problem := check_name(model_root.name):
        raise ArtifactError(f"cannot create a version under {model_root}: {problem}")
    model_root.mkdir(parents=True, exist_ok=True)
    taken = [int(p.name) for p in model_root.iterdir() if is_version_name(p.name)]
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
    if (path / MANIFEST_NAME).is_file() or is_version_name(path.name) or path.name.isdigit():
        return path  # a version directory: loading it says what is wrong with it, if anything
    if not path.exists():
        raise ArtifactError(f"artifact {path} does not exist; pass artifacts/<name>[/<version>]")
    found = versions(path)
    if not found:
        raise ArtifactError(f"{path} holds no artifact: no {MANIFEST_NAME} in it or in a numbered version under it")
    return path / str(found[-1])
