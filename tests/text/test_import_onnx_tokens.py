"""A token model imported as ONNX: generated inputs valid for its embeddings (ids below each table read from
the graph, token types 0, masks 1), and the limits `--vocab-size/--padding-id/--max-length/--tokenizer` record."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from pipeline.artifact.directory import Artifact
from pipeline.artifact.golden import load_golden
from pipeline.artifact.tokens import TOKENIZER_FILE, TokenLimits
from pipeline.cli.group import main
from pipeline.export.token_graph import embedding_rows

NAMES = ["input_ids", "attention_mask", "token_type_ids"]


@pytest.fixture(scope="module")
def bert_onnx(bert_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The BERT as a user exports it: torch.onnx.export, three int64 inputs, dynamic batch and sequence."""
    import torch
    from transformers import AutoModel

    class Encoder(torch.nn.Module):  # keyword arguments: BertModel.forward's positional order is not these
        def __init__(self) -> None:
            super().__init__()
            self.bert = AutoModel.from_pretrained(bert_dir).eval()

        def forward(self, ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
            return self.bert(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state

    model = Encoder().eval()
    path = tmp_path_factory.mktemp("onnx") / "bert.onnx"
    ids = torch.randint(5, 100, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 5:] = 0
    axes = {n: {0: "batch", 1: "sequence"} for n in NAMES}
    with torch.no_grad(), pytest.warns(Warning):  # the TorchScript exporter warns about itself
        torch.onnx.export(
            model,
            (ids, mask, torch.zeros_like(ids)),
            str(path),
            input_names=NAMES,
            output_names=["last_hidden_state"],
            dynamic_axes=axes,
            opset_version=18,
            dynamo=False,
        )
    return path


def test_the_graph_says_how_large_each_embedding_is(bert_onnx: Path) -> None:
    import onnx

    rows = embedding_rows(onnx.load(str(bert_onnx), load_external_data=False))
    assert rows == {"input_ids": 128, "token_type_ids": 2}  # the mask indexes no table


def test_a_bert_imports_on_generated_inputs_its_embeddings_take(bert_onnx: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["import", str(bert_onnx), "--name", "bert", "--repository", str(tmp_path), "--padding-id", "0",
               "--max-length", "64"]
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    artifact = Artifact.load(tmp_path / "bert" / "1")
    assert TokenLimits.read(artifact.manifest.inputs) == TokenLimits(
        names={"ids": "input_ids", "mask": "attention_mask", "type_ids": "token_type_ids"},
        vocab_size=128,
        padding_id=0,
        max_length=64,
        type_count=2,
    )
    golden = load_golden(artifact).inputs
    assert golden["input_ids"].max() < 128 and golden["input_ids"].max() >= 8  # drawn across the vocabulary
    assert (golden["token_type_ids"] == 0).all() and (golden["attention_mask"] == 1).all()
    assert artifact.manifest.tokenizer is None  # ids only: no --tokenizer
    assert "vocab_size 128" in result.output
    refused = CliRunner().invoke(main, ["predict", str(artifact.root), "--text", "a cat"])
    assert refused.exit_code == 2 and "this model carries no tokenizer" in refused.output


def test_a_tokenizer_given_for_an_onnx_model_is_carried(bert_onnx: Path, bert_dir: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["import", str(bert_onnx), "--name", "bert", "--repository", str(tmp_path), "--tokenizer", str(bert_dir)]
    )
    assert result.exit_code == 0, result.output
    manifest = Artifact.load(tmp_path / "bert" / "1").manifest
    assert manifest.tokenizer is not None and TOKENIZER_FILE in manifest.files
    limits = TokenLimits.read(manifest.inputs)
    assert limits is not None and (limits.padding_id, limits.max_length) == (0, 32)  # from the tokenizer


def test_limits_that_contradict_the_graph_are_refused(bert_onnx: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["import", str(bert_onnx), "--name", "bert", "--repository", str(tmp_path), "--vocab-size", "500"]
    )
    assert result.exit_code == 2
    assert "--vocab-size 500: input 'input_ids' indexes a table of 128 rows" in result.output
    assert not (tmp_path / "bert").exists()


def test_generated_ids_stay_small_for_integer_inputs_of_no_known_table() -> None:
    from pipeline.artifact.tensors import TensorSpec
    from pipeline.export.shapes import generated_inputs

    specs = [TensorSpec("ids", "int64", ["batch", "sequence"])]
    arrays = generated_inputs(specs, {"sequence": 4}, 3, ranges={"ids": (0, 1000)})
    assert arrays["ids"].shape == (3, 4) and arrays["ids"].max() < 1000
    assert np.asarray(generated_inputs(specs, {"sequence": 4}, 3)["ids"]).max() < 8


# A table pipe cannot read from the graph (it passes through Identity before the Gather): 4 rows.
HIDDEN_TABLE = """
<ir_version: 8, opset_import: ["" : 18]>
lookup (int64[batch, sequence] input_ids) => (float[batch, sequence, 2] hidden)
<float[4, 2] W = {0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0}>
{
    table = Identity(W)
    hidden = Gather(table, input_ids)
}
"""


def test_ids_past_an_unread_table_ask_for_the_vocabulary_not_a_shape(tmp_path: Path) -> None:
    import onnx.parser

    path = tmp_path / "lookup.onnx"
    onnx.save(onnx.parser.parse_model(HIDDEN_TABLE), str(path))
    runner = CliRunner()
    refused = runner.invoke(main, ["import", str(path), "--name", "lookup", "--repository", str(tmp_path / "a")])
    assert refused.exit_code == 2
    assert "name the vocabulary with --vocab-size" in refused.output and "--input-shape" not in refused.output
    given = runner.invoke(
        main, ["import", str(path), "--name", "lookup", "--repository", str(tmp_path / "a"), "--vocab-size", "4"]
    )
    assert given.exit_code == 0, given.output
    limits = TokenLimits.read(Artifact.load(tmp_path / "a" / "lookup" / "1").manifest.inputs)
    assert limits is not None and limits.vocab_size == 4
