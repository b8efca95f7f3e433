"""Crash-safe file writes and content hashing, shared by every stage."""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

from pipeline.core.errors import InputError

_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes, read in chunks so large models stay out of memory."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def fsync_dir(path: Path) -> None:
    """Persist a directory entry (a rename or a new file) on filesystems that need it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it is fsynced and renamed onto `path`.

    Whoever writes the file (numpy, onnx, safetensors...) writes to the yielded path. A crash or an
    exception before the rename leaves `path` as it was: never half written. The file gets the
    permissions any new file gets (0666 less the umask), not mkstemp's owner-only 0600: a server
    or a Triton container running as another user must be able to read the artifact.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # O_EXCL: never someone else's file
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        if tmp.exists():
            tmp.unlink()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that readers see the old content or the new, never a mix."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_user_file(path: Path, data: bytes, flag: str) -> None:
    """Write a file the user named on the command line (a report, a baseline) atomically, and only as a
    regular file: an existing device, FIFO, directory or symbolic link at `path` is refused, not replaced
    (run as root, replacing /dev/full or a link to /proc/self/fd/1 with a regular file breaks the system).
    Any failure is InputError naming `flag`."""
    path = Path(path)
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise InputError(
            f"{flag} {path}: it exists and is not a regular file (a device, FIFO, directory or link); "
            "give the path of a regular file to write"
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, data)
    except OSError as exc:
        raise InputError(f"{flag} {path}: cannot write it ({exc.strerror or exc})") from None
