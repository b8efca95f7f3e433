"""`pipe predict --text`: texts tokenized with the tokenizer the artifact carries, as the server does."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from pipeline.cli.group import main
from tests.text.test_import_hf import _transformers_embedding

TEXTS = ["the cat sat on the mat", "dogs"]


def test_predict_text_gives_the_transformers_embedding(text_repository: Path, bert_dir: Path) -> None:
    args = ["predict", str(text_repository / "embed"), "--json"]
    result = CliRunner().invoke(main, [*args, *(x for t in TEXTS for x in ("--text", t))])
    assert result.exit_code == 0, result.output
    got = np.array(json.loads(result.output)["outputs"]["embedding"]["values"])
    want = _transformers_embedding(bert_dir, TEXTS)
    assert ((got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)).min() >= 0.9999


def test_predict_text_on_a_classifier_shows_its_labels(text_repository: Path) -> None:
    result = CliRunner().invoke(main, ["predict", str(text_repository / "sentiment"), "--text", "the cat sat"])
    assert result.exit_code == 0, result.output
    assert "neg" in result.output and "pos" in result.output


def test_text_or_a_file_one_of_the_two(text_repository: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["predict", str(text_repository / "embed")])
    assert result.exit_code == 2 and "--input FILE or as --text TEXT" in result.output
    ids = tmp_path / "ids.json"
    ids.write_text(json.dumps({"input_ids": [[2, 7, 3]], "attention_mask": [[1, 1, 1]], "token_type_ids": [[0, 0, 0]]}))
    result = runner.invoke(main, ["predict", str(text_repository / "embed"), "--input", str(ids), "--text", "x"])
    assert result.exit_code == 2
    result = runner.invoke(main, ["predict", str(text_repository / "embed"), "--input", str(ids)])
    assert result.exit_code == 0, result.output  # token ids still work
