"""A model imported without real evaluation data is judged on generated inputs: the import record says so,
and so does every report that shows a judgement (import, pipe info, the optimize report, the check
report, the model card); one imported with real data says nothing of the kind."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx.parser
from click.testing import CliRunner

from pipeline.artifact.directory import Artifact
from pipeline.cli import main
from pipeline.samples.evaluation import GENERATED_NOTE, evaluation_set
from tests.conftest import LINEAR


def invoke(*args: object) -> str:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.output


def test_every_judgement_of_a_model_imported_without_eval_data_says_it_was_on_generated_inputs(tmp_path: Path) -> None:
    onnx.save(onnx.parser.parse_model(LINEAR), tmp_path / "linear.onnx")
    repo, version = tmp_path / "artifacts", tmp_path / "artifacts" / "linear" / "1"
    imported = invoke("import", tmp_path / "linear.onnx", "--name", "linear", "--repository", repo)
    assert GENERATED_NOTE in imported and "--eval-data" in imported
    artifact = Artifact.load(version)
    record = artifact.manifest.stages.import_
    assert record.golden == "generated" and record.judged_on_generated
    evaluation = evaluation_set(artifact)
    assert evaluation.generated and GENERATED_NOTE in evaluation.source
    assert GENERATED_NOTE in invoke("info", version)

    invoke("optimize", version, "--quantize", "dynamic")
    assert GENERATED_NOTE in (version / "reports" / "optimize.md").read_text()
    assert GENERATED_NOTE in json.loads((version / "reports" / "optimize.json").read_text())["evaluation"]

    checked = invoke("check", version, "--baseline", version, "--latency-seconds", "0.2",
                     "--markdown", tmp_path / "check.md", "--json", tmp_path / "check.json")  # fmt: skip
    assert GENERATED_NOTE in checked and GENERATED_NOTE in (tmp_path / "check.md").read_text()
    assert any(GENERATED_NOTE in note for note in json.loads((tmp_path / "check.json").read_text())["notes"])

    invoke("report", version)
    assert GENERATED_NOTE in (version / "reports" / "model-card.md").read_text()


def test_a_model_imported_with_real_data_is_not_said_to_be_judged_on_noise(tmp_path: Path) -> None:
    onnx.save(onnx.parser.parse_model(LINEAR), tmp_path / "linear.onnx")
    x = np.random.default_rng(0).standard_normal((20, 4)).astype(np.float32)
    np.savez(tmp_path / "eval.npz", x=x)
    version = tmp_path / "artifacts" / "linear" / "1"
    args = ["--name", "linear", "--repository", tmp_path / "artifacts", "--eval-data", tmp_path / "eval.npz"]
    assert GENERATED_NOTE not in invoke("import", tmp_path / "linear.onnx", *args)
    assert not evaluation_set(Artifact.load(version)).generated
    assert GENERATED_NOTE not in invoke("info", version)
    invoke("report", version)
    assert GENERATED_NOTE not in (version / "reports" / "model-card.md").read_text()
