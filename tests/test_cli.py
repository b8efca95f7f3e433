from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from pipeline import __version__
from pipeline.artifact.directory import Artifact
from pipeline.cli import main


def test_version() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert __version__ in result.output


def test_help_lists_commands() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    assert "info" in result.output


@pytest.mark.parametrize("command", sorted(main.commands))
def test_every_command_has_help(command: str) -> None:
    result = CliRunner().invoke(main, [command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage: main " + command in result.output or f"{command} [OPTIONS]" in result.output


def test_info_table_and_json(toy_artifact: Artifact) -> None:
    runner = CliRunner()
    table = runner.invoke(main, ["info", str(toy_artifact.root)])
    assert table.exit_code == 0, table.output
    assert "toy v1" in table.output and "accuracy=0.97" in table.output and "model.onnx" in table.output
    as_json = runner.invoke(main, ["info", str(toy_artifact.root.parent), "--json"])  # latest version
    assert as_json.exit_code == 0
    assert json.loads(as_json.output)["name"] == "toy"


def test_info_on_a_tampered_artifact_exits_2_with_the_reason(toy_artifact: Artifact) -> None:
    (toy_artifact.root / "model.onnx").write_bytes(b"evil")
    result = CliRunner().invoke(main, ["info", str(toy_artifact.root)])
    assert result.exit_code == 2
    assert "model.onnx: size 4 bytes" in result.output
    skipped = CliRunner().invoke(main, ["info", str(toy_artifact.root), "--no-verify"])
    assert skipped.exit_code == 0


def test_info_on_a_missing_artifact_exits_2(tmp_path) -> None:
    result = CliRunner().invoke(main, ["info", str(tmp_path / "nothing")])
    assert result.exit_code == 2
    assert "does not exist" in result.output


def test_real_console_script_runs() -> None:
    proc = subprocess.run([sys.executable, "-m", "pipeline", "--version"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert __version__ in proc.stdout
