"""Finding versions on disk: the one version-directory scan, strays beside it, and paths `pipe serve` refuses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.errors import InputError
from pipeline.serve.scan import check_paths, find_versions
from tests.serve.serve_models import mlp, write_artifact


def test_only_ascii_digit_directories_are_versions_and_the_rest_are_named(tmp_path: Path) -> None:
    repo = tmp_path / "artifacts"
    write_artifact(repo, "m", 1, mlp([4, 8, 3], seed=1))
    write_artifact(repo, "n", 2, mlp([4, 8, 3], seed=2))
    for stray in ("²", "01"):  # a digit to Python, and a leading zero: neither is a version
        (repo / "m" / stray).mkdir()
        (repo / "m" / stray / "manifest.json").write_text("{}")
    (repo / "m" / "3").mkdir()  # a version still being written: no manifest yet, not listed, not a stray

    for path in (repo, repo / "m"):
        found = find_versions((path,))
        assert found.versions["m"] == {1: repo / "m" / "1"}
        assert sorted(p.name for p in found.strays) == ["01", "²"]
        assert (
            "'²' is not a version directory name; a served version lives in <name>/<N>"
            in (found.strays[repo / "m" / "²"])
        )
    assert find_versions((repo,)).versions["n"] == {2: repo / "n" / "2"}
    assert find_versions((repo / "n" / "2",)).versions == {"n": {2: repo / "n" / "2"}}


def test_relative_paths_are_named_by_their_real_directories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_artifact(tmp_path / "artifacts", "m", 1, mlp([4, 8, 3]))
    monkeypatch.chdir(tmp_path / "artifacts" / "m" / "1")
    assert find_versions((Path("."),)).versions == {"m": {1: tmp_path / "artifacts" / "m" / "1"}}
    check_paths((Path("."),))


@pytest.mark.parametrize(
    ("layout", "given", "needle"),
    [
        ("m/²", "m/²", "'²' is not a version number (a served version lives in <name>/<N>"),
        ("m/latest", "m/latest", "'latest' is not a version number"),
        ("Big Model/1", "Big Model/1", "name 'Big Model' is not a safe directory name"),
        ("Big Model/1", "Big Model", "name 'Big Model' is not a safe directory name"),
        ("m/1", "m/1/model.onnx", "is not a directory"),
    ],
)
def test_a_path_that_is_no_repository_model_or_version_exits_2(
    tmp_path: Path, layout: str, given: str, needle: str
) -> None:
    (tmp_path / layout).mkdir(parents=True)
    (tmp_path / layout / "manifest.json").write_text("{}")
    (tmp_path / layout / "model.onnx").write_bytes(b"")
    with pytest.raises(InputError, match="pass a repository"):
        check_paths((tmp_path / given,))
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "serve", str(tmp_path / given)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr  # one line, no traceback


def test_a_non_ascii_digit_directory_without_a_manifest_is_refused_too(tmp_path: Path) -> None:
    (tmp_path / "m" / "²").mkdir(parents=True)
    with pytest.raises(InputError, match="'²' is not a version number"):
        check_paths((tmp_path / "m" / "²",))
    check_paths((tmp_path / "m",))  # a repository (of one model, so far empty): hot reload may fill it


def test_an_unreadable_model_directory_is_named_and_the_others_are_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory the server may not read (another user's, mode 0700) must not hide every other model."""
    repo = tmp_path / "artifacts"
    write_artifact(repo, "m", 1, mlp([4, 8, 3], seed=1))
    write_artifact(repo, "locked", 1, mlp([4, 8, 3], seed=2))
    real_iterdir = Path.iterdir

    def iterdir(self: Path):
        if self.name == "locked":  # what a non-root server sees; the tests run as any user
            raise PermissionError(13, "Permission denied", str(self))
        return real_iterdir(self)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    found = find_versions((repo,))
    assert found.versions == {"m": {1: repo / "m" / "1"}}
    assert "cannot read it: [Errno 13] Permission denied" in found.strays[repo / "locked"]
