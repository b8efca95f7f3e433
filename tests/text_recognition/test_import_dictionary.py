"""A CTC recognizer imported with its dictionary as a labels file (`--task text-recognition`), through the real
command line (click's CliRunner) on a small recognizer written with onnx.helper: every line of the file is
kept (a space, an ideographic space, an empty line: each a class, in order), target texts of --eval-data
become the text metric, a dictionary that does not fit is refused naming the counts, and `pipe predict`
prints the texts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from pipeline.cli import main

DICTIONARY = ["a", " ", "\u3000", "", "b"]  # a space, an ideographic space and an empty line among the entries
CLASSES = len(DICTIONARY) + 2  # blank, the dictionary, a space (PaddleOCR's convention)


def recognizer(path: Path) -> None:
    """x [batch, positions, classes] -> probs = softmax(x): a recognizer whose answer the test chooses."""
    graph = helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["probs"], axis=-1)],
        "rec",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "positions", CLASSES])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", "positions", CLASSES])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), path)


def scores(rows: list[list[int]]) -> np.ndarray:
    """Inputs whose softmax's best class per position is given."""
    x = np.zeros((len(rows), len(rows[0]), CLASSES), np.float32)
    for b, row in enumerate(rows):
        x[b, np.arange(len(row)), row] = 8.0
    return x


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dictionary")
    recognizer(root / "rec.onnx")
    (root / "dict.txt").write_text("\n".join(DICTIONARY) + "\n", encoding="utf-8")
    # texts: "a b" (a, space entry, b), "\u3000a" and "ba": the third is read "b" by the model below
    x = scores([[1, 0, 2, 0, 5, 0], [3, 3, 0, 1, 0, 0], [5, 0, 0, 0, 0, 0]])
    np.savez(root / "eval.npz", x=x, target=np.array(["a b", "\u3000a", "ba"]))
    result = CliRunner().invoke(main, ["import", str(root / "rec.onnx"), "--name", "rec", "--task", "text-recognition",
                                       "--labels-file", str(root / "dict.txt"), "--eval-data", str(root / "eval.npz"),
                                       "--repository", str(root / "repo")])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "ctc: {'blank': 0, 'space': True} (5 entries for 7 classes: blank 0 and a space after it)" in result.output
    assert "dictionary entries 1 (' '), 2 ('\\u3000'), 3 ('') are empty or white space: kept" in result.output
    return root


def test_every_line_of_the_dictionary_is_a_class_in_order(made: Path) -> None:
    manifest = json.loads((made / "repo" / "rec" / "1" / "manifest.json").read_text())
    assert manifest["task"] == "text-recognition"
    assert manifest["labels"] == DICTIONARY
    assert manifest["ctc"] == {"blank": 0, "space": True}


def test_target_texts_give_text_agreement_and_character_error_rate(made: Path) -> None:
    manifest = json.loads((made / "repo" / "rec" / "1" / "manifest.json").read_text())
    assert manifest["metrics"] == {"text_agreement": pytest.approx(2 / 3), "cer": pytest.approx(1 / 7)}


def test_predict_prints_each_text(made: Path) -> None:
    np.savez(made / "one.npz", x=scores([[1, 0, 6, 6, 0, 3], [2, 0, 0, 0, 0, 0]]))
    result = CliRunner().invoke(main, ["predict", str(made / "repo" / "rec"), "--input", str(made / "one.npz")])
    assert result.exit_code == 0, result.output
    assert "sample 0: 'a \\u3000'  confidence" in result.output  # the appended space class, then U+3000
    assert "sample 1: ' '  confidence" in result.output
    assert "probs: float32[2, 6, 7]  (read above as text: greedy CTC decoding)" in result.output
    result = CliRunner().invoke(main, ["predict", str(made / "repo" / "rec"), "--input", str(made / "one.npz"),
                                       "--json"])  # fmt: skip
    assert [t["text"] for t in json.loads(result.output)["texts"]] == ["a \u3000", " "]


def test_a_dictionary_that_does_not_fit_the_classes_is_refused_naming_the_counts(made: Path) -> None:
    (made / "short.txt").write_text("a\nb\n", encoding="utf-8")
    result = CliRunner().invoke(main, ["import", str(made / "rec.onnx"), "--name", "short", "--task",
                                       "text-recognition", "--labels-file", str(made / "short.txt"),
                                       "--repository", str(made / "repo")])  # fmt: skip
    assert result.exit_code == 2
    assert "--labels holds 2 entries, but output 'probs' has 7 classes; a CTC dictionary leaves out" in result.output
    assert not (made / "repo" / "short").exists()


def test_a_target_character_the_dictionary_lacks_is_refused(made: Path) -> None:
    np.savez(made / "bad.npz", x=scores([[1, 0, 0, 0, 0, 0]]), target=np.array(["az"]))
    result = CliRunner().invoke(main, ["import", str(made / "rec.onnx"), "--name", "bad", "--task",
                                       "text-recognition", "--labels-file", str(made / "dict.txt"), "--eval-data",
                                       str(made / "bad.npz"), "--repository", str(made / "repo")])  # fmt: skip
    assert result.exit_code == 2
    assert "target text 0 ('az') holds 'z', which the dictionary has no class for" in result.output


def test_a_lossy_variant_is_judged_by_text_agreement(made: Path) -> None:
    result = CliRunner().invoke(main, ["optimize", str(made / "repo" / "rec"), "--quantize", "fp16", "--graph", "none"])
    assert result.exit_code == 0, result.output
    assert "budget text agreement (min_agreement 0.95)" in result.output
    assert ("fp16: passed: texts equal 3 of 3 (1.0000), character error rate 0.0000; budget >= 0.95: at most 1 of 3 "
            "read otherwise") in result.output  # fmt: skip
    manifest = json.loads((made / "repo" / "rec" / "1" / "manifest.json").read_text())
    assert manifest["variants"]["fp16"]["metrics"]["text_agreement"] == pytest.approx(2 / 3)  # against the targets


def test_a_classifier_labels_file_with_a_blank_line_inside_is_refused_not_shifted(made: Path) -> None:
    (made / "names.txt").write_text("a\n \nb\n\n", encoding="utf-8")  # before: the space line was dropped silently
    result = CliRunner().invoke(main, ["import", str(made / "rec.onnx"), "--name", "names", "--labels-file",
                                       str(made / "names.txt"), "--repository", str(made / "repo")])  # fmt: skip
    assert result.exit_code == 2
    assert "line 2 is empty or white space" in result.output and "--task text-recognition" in result.output


def test_a_paddle_dictionary_with_an_empty_and_a_repeated_line_keeps_every_line(tmp_path: Path) -> None:
    recognizer(tmp_path / "rec.onnx")
    model = onnx.load(tmp_path / "rec.onnx")
    helper.set_model_props(model, {"character": "a\n\nb\na\nc\n"})  # 5 lines: blank + 5 + space = 7 classes
    onnx.save(model, tmp_path / "paddle.onnx")
    result = CliRunner().invoke(main, ["import", str(tmp_path / "paddle.onnx"), "--name", "paddle",
                                       "--repository", str(tmp_path / "repo")])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "task: text-recognition (metadata_props['character'] (Paddle): a dictionary for output 'probs'" in (
        result.output
    )
    assert "ignored" not in result.output  # as class names the lines would be set aside; as a dictionary, kept
    manifest = json.loads((tmp_path / "repo" / "paddle" / "1" / "manifest.json").read_text())
    assert manifest["labels"] == ["a", "", "b", "a", "c"] and manifest["ctc"] == {"blank": 0, "space": True}
