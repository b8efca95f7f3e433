"""Where the served versions are on disk: the paths given to `pipe serve`, scanned for version directories.

Each path may be a repository (`artifacts/`, holding `<name>/<version>/`), one model
(`artifacts/<name>`) or one version (`artifacts/<name>/<version>`). Version directories are found
by `pipeline.artifact.directory.version_dirs`, the one scan of a model directory (ASCII-digit names holding a
manifest). A directory beside them that holds a manifest but is not a version (`²`, `01`, `v2`)
is a stray: it is never served, and the scan says why so the server can log it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.artifact.directory import Artifact, is_version_name, version_dirs
from pipeline.artifact.manifest import MANIFEST_NAME, check_name
from pipeline.core.errors import ArtifactError, InputError
from pipeline.serve.variant_choice import choose_quietly

_VERSION_RULE = "a served version lives in <name>/<N>, N in ASCII digits without a leading zero (1, 2, 3 ...)"


@dataclass
class Scan:
    """What one scan found."""

    versions: dict[str, dict[int, Path]] = field(default_factory=dict)  # model name -> version -> directory
    strays: dict[Path, str] = field(default_factory=dict)  # a directory never served (no version, unreadable) -> why


def check_paths(paths: tuple[Path, ...], variants: dict[str, str] | None = None) -> None:
    """Refuse, before the server starts (exit 2), a path that is not a repository, model or version directory,
    or a version directory that would not be served (it does not verify, or its chosen variant is refused)."""
    choices = "pass a repository (artifacts/), a model (artifacts/<name>) or a version (artifacts/<name>/<N>)"
    for path in map(_absolute, paths):
        if not path.is_dir():
            raise InputError(f"{path} is not a directory; {choices}")
        if (path / MANIFEST_NAME).is_file():
            problem = (
                check_name(path.parent.name)
                if is_version_name(path.name)
                else f"it holds {MANIFEST_NAME} but {path.name[:40]!r} is not a version number ({_VERSION_RULE})"
            )
            if problem is None:
                # One version named on the command line is all this server would serve: refuse it
                # now, with the loader's reason, rather than start with nothing to serve.
                try:
                    choose_quietly(Artifact.load(path, verify=True), variants or {})
                except ArtifactError as exc:
                    problem = one_line(exc)
        elif version_dirs(path):
            problem = check_name(path.name)
        elif path.name.isdigit() and not is_version_name(path.name):  # '²', '007': never a version
            problem = f"{path.name[:40]!r} is not a version number ({_VERSION_RULE})"
        else:
            problem = None  # a repository, possibly empty until hot reload finds models in it
        if problem:
            raise InputError(f"{path}: {problem}; {choices}")


def find_versions(paths: tuple[Path, ...]) -> Scan:
    """Every version directory under the paths, and every stray directory beside them."""
    scan = Scan()
    for path in map(_absolute, paths):
        if (path / MANIFEST_NAME).is_file():
            if is_version_name(path.name):
                scan.versions.setdefault(path.parent.name, {})[int(path.name)] = path
            else:
                scan.strays[path] = _stray_reason(path)
        elif version_dirs(path):
            _scan_model(path, scan)
        elif path.is_dir():
            for model in sorted(p for p in path.iterdir() if p.is_dir()):
                _scan_model(model, scan)
    return scan


def _scan_model(model_root: Path, scan: Scan) -> None:
    try:
        versions = version_dirs(model_root)
        # The complement of version_dirs, to report it: a manifest in a directory that is not a version.
        strays = [c for c in model_root.iterdir() if c not in versions.values() and (c / MANIFEST_NAME).is_file()]
    except OSError as exc:  # e.g. another user's directory: it must not hide the models beside it
        scan.strays[model_root] = (
            f"cannot read it: {exc}; give the server's user read access to it or move it out of the repository"
        )
        return
    if versions:
        scan.versions.setdefault(model_root.name, {}).update(versions)
    for child in strays:
        scan.strays[child] = _stray_reason(child)


def one_line(exc: BaseException) -> str:
    """A refusal as one log or error line (verification lists each bad file on its own line)."""
    return " ".join(line.strip() for line in str(exc).splitlines() if line.strip())


def _stray_reason(directory: Path) -> str:
    return f"{directory.name[:40]!r} is not a version directory name; {_VERSION_RULE}"


def _absolute(path: Path) -> Path:
    """Absolute without resolving symlinks: `.` and `..` get their real names, a symlink stays visible."""
    return Path(os.path.abspath(path))
