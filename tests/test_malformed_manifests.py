"""Every malformed manifest or version directory is refused by info, export and serve: one line, exit 2.

A manifest is edited by hand, copied and linked around: whatever it holds, pipe answers with the
reason and never a traceback. The healthy version beside the bad one stays loadable.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.artifact.directory import Artifact
from pipeline.cli import main
from tests.conftest import build_artifact


def _edit(root: Path, **changes: object) -> Path:
    path = root / "manifest.json"
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))
    return root


def _edit_input(root: Path, key: str, value: object) -> Path:
    data = json.loads((root / "manifest.json").read_text())
    data["inputs"][0][key] = value
    (root / "manifest.json").write_text(json.dumps(data))
    return root


def _raw(root: Path, old: str, new: str) -> Path:
    path = root / "manifest.json"
    path.write_text(path.read_text().replace(old, new, 1))
    return root


def _manifest_linked_out(root: Path) -> Path:
    outside = root.parent.parent.parent / "elsewhere.json"
    shutil.move(root / "manifest.json", outside)
    (root / "manifest.json").symlink_to(outside)
    return root


def _version_linked_out(root: Path) -> Path:
    outside = root.parent.parent.parent / "outside" / "toy" / "2"
    outside.parent.mkdir(parents=True)
    shutil.move(root, outside)
    root.symlink_to(outside, target_is_directory=True)
    return root


def _parity_rows(root: Path, rows: object) -> Path:
    """An export record whose parity rows were edited: readers index them, so they are checked on load."""
    export = {"exporter": "dynamo", "opset": 18, "requested_opset": 18, "external_data": False,
              "parity": {"passed": True, "rows": rows}}  # fmt: skip
    return _edit(root, stages={"export": export})


def _superscript_version(root: Path) -> Path:
    odd = root.parent / "²"
    root.rename(odd)
    return odd


# case -> (make it from a healthy toy/2, text the one-line error must hold)
CASES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "name ../../x": (lambda r: _edit(r, name="../../x"), "is not a safe directory name"),
    "absolute name": (lambda r: _edit(r, name="/srv/models/x"), "is not a safe directory name"),
    "string shape": (lambda r: _edit_input(r, "shape", "batch,4"), "inputs[0].shape: expected a list"),
    "unknown dtype": (lambda r: _edit_input(r, "dtype", "float99"), "inputs[0].dtype: 'float99' is not one of"),
    "stages []": (lambda r: _edit(r, stages=[]), "stages: expected an object"),
    "size as a string": (lambda r: _raw(r, '"size": 340', '"size": "340"'), "size: expected an integer"),
    "5,000-digit integer": (lambda r: _raw(r, '"version": 2', '"version": ' + "9" * 5000), "not valid JSON"),
    "10,000-deep nesting": (
        lambda r: _raw(r, '"metrics": {', '"labels": ' + "[" * 10_000 + "]" * 10_000 + ', "metrics": {'),
        "nested too deeply",
    ),
    "parity rows 'none'": (lambda r: _parity_rows(r, "none"), "stages.export.parity: rows must be a list of objects"),
    "parity rows of numbers": (lambda r: _parity_rows(r, [1, 2]), "stages.export.parity: rows must be a list of"),
    "manifest.json symlinked outside": (_manifest_linked_out, "manifest.json is a symlink to"),
    "version directory symlinked outside": (_version_linked_out, "version directory"),
    "version directory named '²'": (_superscript_version, "'²' is not a version"),
}


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    repo = tmp_path / "artifacts"
    build_artifact(repo / "toy" / "1", "toy", 1)
    build_artifact(repo / "toy" / "2", "toy", 2)
    return repo


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_line_refusal(output: str, needle: str) -> None:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    assert lines[0].startswith("error: ") and needle in lines[0], output
    assert "Traceback" not in output


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("command", ["info", "export"])
def test_info_and_export_refuse_it_in_one_line(repository: Path, case: str, command: str) -> None:
    make, needle = CASES[case]
    bad = make(repository / "toy" / "2")
    result = CliRunner().invoke(main, [command, str(bad)])
    assert result.exit_code == 2, result.output
    _one_line_refusal(result.output, needle)
    assert Artifact.load(repository / "toy" / "1").manifest.version == 1  # the healthy version beside it


@pytest.mark.parametrize("case", list(CASES))
def test_serve_refuses_it_before_listening(repository: Path, case: str) -> None:
    make, needle = CASES[case]
    bad = make(repository / "toy" / "2")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    port = free_port()  # were it not refused, it would serve here until the timeout fails the test
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "serve", str(bad), "--port", str(port), "--poll", "0"],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert proc.returncode == 2, proc.stderr
    _one_line_refusal(proc.stderr, needle)
