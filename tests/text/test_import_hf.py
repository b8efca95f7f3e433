"""`pipe import DIR` of a transformers model directory: exported through torch with dynamic axes, gated
against transformers in torch, labels from id2label, the tokenizer and its limits in the artifact."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from click.testing import CliRunner

from pipeline.artifact.directory import Artifact
from pipeline.artifact.tokens import TOKENIZER_FILE, TokenLimits
from pipeline.cli.group import main
from pipeline.core.fsutil import sha256_file
from pipeline.runtime.text import TextEncoder

TEXTS = ["a cat sat in the park", "dogs", "the bird sang a song in the tree by the window all day"]


def _transformers_embedding(directory: Path, texts: list[str]) -> np.ndarray:
    """Mean-pooled, normalized embeddings computed by transformers in torch, tokenized by transformers."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModel.from_pretrained(directory).eval()
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    return torch.nn.functional.normalize(pooled, dim=1).numpy()


def test_an_embedding_model_imports_with_its_tokenizer_and_limits(embed_artifact: Artifact, bert_dir: Path) -> None:
    manifest = embed_artifact.manifest
    assert manifest.task == "embedding"
    assert [s.name for s in manifest.inputs] == ["input_ids", "attention_mask", "token_type_ids"]
    assert all(s.shape == ["batch", "sequence"] for s in manifest.inputs)
    assert manifest.outputs[0].name == "embedding" and manifest.outputs[0].shape == ["batch", 32]
    assert TokenLimits.read(manifest.inputs) == TokenLimits(
        names={"ids": "input_ids", "mask": "attention_mask", "type_ids": "token_type_ids"},
        vocab_size=128,
        padding_id=0,
        max_length=32,
        type_count=2,
    )
    assert manifest.tokenizer is not None and TOKENIZER_FILE in manifest.files
    record = manifest.stages.import_
    assert record is not None and record.convention == "Hugging Face"
    assert record.settings == {"task": "embedding", "pooling": "mean", "normalize": True, "exporter": "torchscript"}
    assert record.parity["passed"]
    checks = {row["check"] for row in record.parity["rows"]}  # two batch sizes, two sequence lengths
    assert {"batch 1", "batch 2"} <= checks and any(c.startswith("batch 2, sequence ") for c in checks)

    # served text gives transformers' own embedding (its tokenizer, its model, torch)
    encoder = TextEncoder.of(embed_artifact.root, manifest)
    assert encoder is not None
    session = ort.InferenceSession(str(embed_artifact.root / "model.onnx"))
    (got,) = session.run(None, encoder.encode(TEXTS))
    want = _transformers_embedding(bert_dir, TEXTS)
    cosine = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosine.min() >= 0.9999, cosine


def test_a_classifier_takes_its_labels_from_id2label(text_repository: Path) -> None:
    info = CliRunner().invoke(main, ["info", str(text_repository / "sentiment" / "1")])
    assert "tokens: ids, values 0..127, padding 0, max length 32" in info.output
    assert "tokenizer tokenizer/tokenizer.json: takes text" in info.output
    manifest = Artifact.load(text_repository / "sentiment" / "1").manifest
    assert manifest.task == "classification" and manifest.labels == ["neg", "pos"]
    assert manifest.outputs[0].name == "logits" and manifest.outputs[0].shape == ["batch", 2]


def test_a_directory_that_is_no_transformers_model_is_one_line(tmp_path: Path) -> None:
    runner = CliRunner()
    (tmp_path / "empty").mkdir()
    result = runner.invoke(main, ["import", str(tmp_path / "empty"), "--name", "x"])
    assert result.exit_code == 2
    assert "is a directory without config.json, so not a transformers model" in result.output
    assert "Traceback" not in result.output

    config = tmp_path / "model" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps({"architectures": ["BertModel"], "model_type": "bert"}))
    result = runner.invoke(main, ["import", str(config), "--name", "x"])
    assert result.exit_code == 2, result.output
    assert "is a JSON file, not a model" in result.output and f"pipe import {config.parent}" in result.output

    result = runner.invoke(main, ["import", str(config.parent), "--name", "x", "--task", "embedding"])
    assert result.exit_code == 2 and "holds config.json but no weights" in result.output

    result = runner.invoke(main, ["import", str(config.parent), "--name", "x"])
    assert result.exit_code == 2 and "--task classification or embedding" in result.output


def test_cls_pooling_takes_the_first_token(bert_dir: Path) -> None:
    import torch
    from transformers import AutoModel

    from pipeline.export.hf_module import TaskHead

    model = AutoModel.from_pretrained(bert_dir).eval()
    ids = torch.tensor([[2, 40, 41, 3, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    types = torch.zeros_like(ids)
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        names = ["input_ids", "attention_mask", "token_type_ids"]
        cls = TaskHead(model, names, "embedding", "cls", False)(ids, mask, types)
        mean = TaskHead(model, names, "embedding", "mean", True)(ids, mask, types)
    torch.testing.assert_close(cls, hidden[:, 0])
    want = torch.nn.functional.normalize(hidden[:, :4].mean(dim=1), dim=1)  # the padded position left out
    torch.testing.assert_close(mean, want)


def test_an_encoder_exported_with_external_data_records_and_hashes_it(
    bert_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An encoder past the protobuf limit is exported with its weights beside the graph: the import lists each
    data file with its sha256, and the fp32 variant's size counts them (it once recorded model.onnx alone;
    issue 44). The export writes a small encoder the way it writes a 2 GB one instead of making one."""
    import onnx

    from pipeline.export import onnx_export
    from pipeline.export.hf import HFSettings, import_hf
    from pipeline.runtime.external_data import external_files, graph_only, save_model

    export = onnx_export.export_module

    def export_beside(*args: Any, **kwargs: Any) -> onnx_export.ExportResult:
        result = export(*args, **kwargs)
        path = Path(args[4])
        save_model(onnx.load(str(path)), path, external=True)  # what a model past the limit is written as
        return replace(result, external_data=True)

    monkeypatch.setattr(onnx_export, "export_module", export_beside)
    artifact = import_hf(bert_dir, "big", tmp_path / "artifacts", HFSettings("embedding"))
    data = external_files(graph_only(artifact.path("model.onnx")), artifact.root)
    assert data == ["model.onnx.data"]
    files = artifact.manifest.files
    assert files["model.onnx.data"].sha256 == sha256_file(artifact.path("model.onnx.data"))
    variant = artifact.manifest.variants["fp32"]
    assert variant.size == files["model.onnx"].size + files["model.onnx.data"].size
    Artifact.load(artifact.root)  # verifies every listed file


def test_the_fp32_variant_records_the_size_of_model_onnx(embed_artifact: Artifact) -> None:
    variant = embed_artifact.manifest.variants["fp32"]
    assert variant.size == embed_artifact.path("model.onnx").stat().st_size > 0
