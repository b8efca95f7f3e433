"""Each variant kind is a unit: a new kind is one module and one line in KINDS, made, judged, timed and recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.artifact.directory import Artifact
from pipeline.cli import main
from pipeline.optimize import stage
from pipeline.optimize.kinds import KINDS
from pipeline.recipe.defaults import QUANTIZE_CHOICES
from tests.optimize.test_stage import imported
from tests.optimize.throwaway_kind import COPY, COPY_OF_OPT


def test_every_kind_names_its_variant_precision_and_what_asks_for_it() -> None:
    names = [kind.name for kind in KINDS]
    assert names == ["opt", "int8-dynamic", "int8-static", "fp16", "int8", "int8-weights", "int4-weights"]
    assert [kind.precision for kind in KINDS] == ["fp32", "int8", "int8", "fp16", "int8", "int8", "int4"]
    # a decoder (text-generation) gets the graph passes and the weight-only kinds; every other task the rest
    assert [k.name for k in KINDS if k.serves("text-generation")] == ["opt", "int8-weights", "int4-weights"]
    assert [k.name for k in KINDS if k.serves("classification")] == names[:5]
    # each --quantize choice (the recipe's and the CLI's, one tuple) asks for exactly one kind, and back
    choices = [kind.choice for kind in KINDS if kind.choice is not None]
    assert sorted(choices) == sorted(QUANTIZE_CHOICES) and len(set(choices)) == len(choices)


def test_a_new_kind_is_one_module_and_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = imported(tmp_path, "lin")
    monkeypatch.setattr(stage, "KINDS", [*KINDS, COPY])  # the one line: the kind added to the list

    result = CliRunner().invoke(main, ["optimize", str(root), "--quantize", "dynamic", "--graph", "none"])

    assert result.exit_code == 0, result.output
    assert "[optimize] copy: " in result.output, result.output
    manifest = Artifact.load(root).manifest  # loading verifies every listed file's hash
    copy = manifest.variants["copy"]
    assert copy.passed and copy.file == "variants/model.copy.onnx" and copy.file in manifest.files
    assert copy.precision == "fp32" and copy.stage == "optimize" and copy.settings == {"debug_info": False}
    assert copy.parent == manifest.files["model.onnx"].sha256 and "p50_ms_b1" in copy.latency  # timed beside fp32
    assert manifest.stages.optimize is not None and manifest.stages.optimize.variants == ["int8-dynamic", "copy"]
    report = json.loads((root / "reports" / "optimize.json").read_text())
    assert [v["variant"] for v in report["variants"]] == ["int8-dynamic", "copy"]
    assert "| copy | passed |" in (root / "reports" / "optimize.md").read_text()


def test_no_module_of_optimize_shares_a_name_with_a_package() -> None:
    """`optimize/samples.py` and `optimize/report.py` once read as pipeline.samples and pipeline.report (issue 27)."""
    package = Path(stage.__file__).parent
    packages = {p.name for p in package.parent.iterdir() if (p / "__init__.py").is_file()}
    assert not {p.stem for p in package.glob("*.py")} & packages


def test_a_kind_made_from_a_parent_variant_records_it_and_is_not_made_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = imported(tmp_path, "lin")
    monkeypatch.setattr(stage, "KINDS", [*KINDS, COPY_OF_OPT])
    args = ["optimize", str(root), "--quantize", "fp16"]

    made = CliRunner().invoke(main, args)

    assert made.exit_code == 0, made.output
    manifest = Artifact.load(root).manifest
    child, opt = manifest.variants["copy-of-opt"], manifest.variants["opt"]
    assert child.passed and child.parent == manifest.files[opt.file].sha256 != manifest.files["model.onnx"].sha256
    assert manifest.variants["fp16"].parent == manifest.files["model.onnx"].sha256

    alone = CliRunner().invoke(main, [*args, "--graph", "none"])  # no opt this run: nothing to make it from

    assert alone.exit_code == 0, alone.output
    assert "copy-of-opt not made: it is made from opt, which this run did not make" in alone.output
    assert "copy-of-opt" not in Artifact.load(root).manifest.variants  # the earlier one, stale, is removed


def test_dynamic_int8_is_per_channel_unless_the_section_says_and_static_per_tensor() -> None:
    """Per channel as dynamic int8's default: on the real all-MiniLM-L6-v2 over 64 texts, mean cosine 0.992 against
    per tensor's 0.960 (docs/gates.md "Embeddings"); static keeps per tensor unless asked."""
    from pipeline.optimize.int8_dynamic import INT8_DYNAMIC
    from pipeline.optimize.int8_static import INT8_STATIC
    from pipeline.recipe.schema import OptimizeSpec

    assert INT8_DYNAMIC.config(OptimizeSpec(), "embedding").per_channel is True
    assert INT8_STATIC.config(OptimizeSpec(), "embedding").per_channel is False
    assert INT8_DYNAMIC.config(OptimizeSpec(per_channel=False), "embedding").per_channel is False
    assert INT8_STATIC.config(OptimizeSpec(per_channel=True), "classification").per_channel is True
