"""Every tolerance and budget can be set for any artifact, imported or trained: on the hop's command line and in
a settings file (`--settings FILE`, one section per hop); a flag a hop would not read is refused (exit 2, named).

Before: `pipe export --target edge --atol X` was silently ignored, `--recipe` was refused for an imported model
and nothing else could loosen its gates. Each case here is refused or read before any slow work starts.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

from pipeline.cli import main
from pipeline.stagekit.settings_file import layered, read_settings
from tests.export.test_export_import import linear_model


def invoke(*args: str | Path):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny ONNX classifier imported without flags: the version directory."""
    root = tmp_path_factory.mktemp("gates")
    onnx.save(linear_model(), root / "linear.onnx")
    done = invoke("import", root / "linear.onnx", "--name", "lin", "--repository", root / "repo")
    assert done.exit_code == 0, done.output
    return root / "repo" / "lin" / "1"


def settings(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gates.yaml"
    path.write_text(text)
    return path


def test_import_takes_the_lossless_tolerances_from_flags_and_a_settings_file(tmp_path: Path) -> None:
    onnx.save(linear_model(), tmp_path / "linear.onnx")
    file = settings(tmp_path, "import: {atol: 0.5, max_out_of_tolerance: 0.01}\nedge: {max_accuracy_drop: 0.2}\n")
    done = invoke("import", tmp_path / "linear.onnx", "--name", "lin", "--repository", tmp_path / "repo",
                  "--settings", file, "--atol", "0.25", "--metric-tolerance", "0.125")  # fmt: skip
    assert done.exit_code == 0, done.output
    record = json.loads((tmp_path / "repo" / "lin" / "1" / "manifest.json").read_text())["stages"]["import"]
    # the flag over the file, the file's own key, the flag alone; edge's section is edge's
    assert record["settings"] == {"atol": 0.25, "max_out_of_tolerance": 0.01, "metric_tolerance": 0.125}


def test_import_refuses_a_lossy_budget_naming_it(tmp_path: Path) -> None:
    done = invoke("import", tmp_path / "missing.onnx", "--name", "x", "--max-accuracy-drop", "0.1")
    assert done.exit_code == 2 and "--max-accuracy-drop: a budget of lossy candidates" in done.output
    assert "pipe import makes only the lossless model.onnx" in done.output


def test_export_server_refuses_a_budget_and_triton_refuses_every_gate_flag(imported: Path) -> None:
    done = invoke("export", imported, "--min-cosine", "0.9")
    assert done.exit_code == 2 and "--min-cosine: a budget of lossy candidates" in done.output, done.output
    done = invoke("export", imported, "--target", "triton", "--out", imported.parent / "t", "--atol", "1")
    assert done.exit_code == 2 and "--atol: --target triton copies model.onnx" in done.output, done.output


def test_edge_reads_the_gate_flags_it_used_to_ignore(imported: Path) -> None:
    # --atol reaches the edge section (validated there: atol > 0), before any conversion
    done = invoke("export", imported, "--target", "edge", "--atol", "0")
    assert done.exit_code == 2 and "--atol edge.atol: Input should be greater than 0" in done.output, done.output
    # a budget for a run that makes only fp32 would be read by nothing: refused, naming it
    done = invoke("export", imported, "--target", "edge", "--precision", "fp32", "--max-accuracy-drop", "0.1")
    assert done.exit_code == 2, done.output
    assert "--max-accuracy-drop: a budget of lossy candidates (fp16, int8), and this edge run makes only fp32" in (
        done.output
    )


def test_an_imported_model_takes_its_settings_from_a_file_where_recipe_is_refused(
    imported: Path, tmp_path: Path
) -> None:
    done = invoke("export", imported, "--target", "edge", "--recipe", tmp_path / "r.yaml")
    assert done.exit_code == 2 and "or in a settings file's edge section (--settings FILE)" in done.output
    file = settings(tmp_path, "edge: {atol: 0}\n")
    done = invoke("export", imported, "--target", "edge", "--settings", file)
    assert done.exit_code == 2 and f"--settings {file} is invalid: edge.atol: Input should be greater than 0" in (
        done.output
    ), done.output


def test_a_settings_file_is_validated_whole_and_layered_under_the_flags(tmp_path: Path) -> None:
    file = settings(tmp_path, "optimize: {max_accuracy_drop: 0.02, quantize: [dynamic]}\nedge: {atol_fp32: 2e-4}\n")
    assert read_settings(file, "optimize") == {"max_accuracy_drop": 0.02, "quantize": ["dynamic"]}
    assert read_settings(file, "edge") == {"atol": 2e-4}  # its old name, read as today's
    assert read_settings(file, "export") == {}
    assert layered(file, "optimize", {"max_accuracy_drop": 0.05, "min_cosine": None}) == {
        "max_accuracy_drop": 0.05, "quantize": ["dynamic"]}  # fmt: skip
    cases = {
        "serve: {port: 1}\n": "unknown section(s) serve; the sections are import, export, optimize, edge",
        "edge: {atol_fp16: 0.01}\n": "atol_fp16 is gone: fp16 is lossy and judged by the task's budget",
        "import: {max_accuracy_drop: 0.1}\n": "import.max_accuracy_drop: Extra inputs are not permitted",
        "edge: {atol: 1}\nedge: {atol: 2}\n": "edge: key given twice (lines 1 and 2)",
        "- 1\n": "expected sections (import, export, optimize, edge), got a list",
    }
    for text, message in cases.items():
        with pytest.raises(Exception, match=message.replace("(", r"\(").replace(")", r"\)")) as caught:
            read_settings(settings(tmp_path, text), "edge")
        assert caught.value.exit_code == 2  # type: ignore[attr-defined]


def test_optimize_reads_its_section_of_the_settings_file_under_its_flags(imported: Path, tmp_path: Path) -> None:
    # the file's budget reaches the chooser, which refuses it for this model (no targets to measure a drop on)
    file = settings(tmp_path, "optimize: {max_accuracy_drop: 0.1}\n")
    done = invoke("optimize", imported, "--settings", file)
    assert done.exit_code == 2 and "max_accuracy_drop 0.1 cannot be measured: the evaluation set has no targets" in (
        done.output
    ), done.output
    done = invoke("optimize", imported, "--settings", file, "--max-accuracy-drop", "0.2")  # the flag over the file
    assert done.exit_code == 2 and "max_accuracy_drop 0.2 cannot be measured" in done.output, done.output
