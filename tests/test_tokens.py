"""Token limits and the tokenizer in the artifact (pipeline/artifact/tokens.py): read from a transformers
directory, written into a version and hashed like every file, read back, and refused when contradictory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.artifact.directory import Artifact
from pipeline.artifact.manifest import Manifest
from pipeline.artifact.tensors import TensorSpec, TokenInput
from pipeline.artifact.tokens import (
    TOKENIZER_CONFIG,
    TOKENIZER_FILE,
    TokenLimits,
    guess_roles,
    hf_limits,
    read_tokenizer,
    write_tokenizer,
)
from pipeline.core.errors import ArtifactError, InputError
from tests.text_models import save_tokenizer

BERT_INPUTS = ["input_ids", "attention_mask", "token_type_ids"]


def _specs() -> list[TensorSpec]:
    return [TensorSpec(name, "int64", ["batch", "sequence"]) for name in BERT_INPUTS]


def test_roles_are_read_from_the_names_exporters_give() -> None:
    assert guess_roles(BERT_INPUTS) == {"ids": "input_ids", "mask": "attention_mask", "type_ids": "token_type_ids"}
    assert guess_roles(["segment_ids", "input_mask", "input_word_ids"]) == {
        "ids": "input_word_ids",
        "mask": "input_mask",
        "type_ids": "segment_ids",
    }
    assert guess_roles(["tokens"]) == {"ids": "tokens"}
    assert guess_roles(["x", "y"]) == {}  # nothing says which holds ids


def test_a_tokenizer_and_config_give_the_limits(tmp_path: Path) -> None:
    save_tokenizer(tmp_path, max_length=32)
    (tmp_path / "config.json").write_text(
        json.dumps({"vocab_size": 128, "type_vocab_size": 2, "max_position_embeddings": 64, "pad_token_id": 0})
    )
    source = read_tokenizer(tmp_path)
    assert source.padding_id == 0 and source.max_length == 32 and source.vocab_size <= 128
    limits = hf_limits(tmp_path, BERT_INPUTS, source)
    assert limits == TokenLimits(
        names={"ids": "input_ids", "mask": "attention_mask", "type_ids": "token_type_ids"},
        vocab_size=128,
        padding_id=0,
        max_length=32,  # the tokenizer's model_max_length, below the 64 positions
        type_count=2,
    )
    specs = limits.apply(_specs())
    assert [s.tokens for s in specs] == [
        TokenInput(128, 32, 0, "ids"),
        TokenInput(2, 32, 0, "mask"),
        TokenInput(2, 32, 0, "type_ids"),
    ]
    assert TokenLimits.read(specs) == limits


def test_a_tokenizer_larger_than_the_embedding_is_refused(tmp_path: Path) -> None:
    save_tokenizer(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 10}))
    with pytest.raises(InputError, match="makes .* ids but the model embeds 10"):
        hf_limits(tmp_path, BERT_INPUTS, read_tokenizer(tmp_path))


def test_a_directory_without_tokenizer_json_says_what_pipe_reads(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="holds no tokenizer.json: pipe reads fast tokenizers"):
        read_tokenizer(tmp_path)


def test_the_tokenizer_goes_into_the_version_hashed_and_comes_back(tmp_path: Path) -> None:
    source = read_tokenizer(save_tokenizer(tmp_path / "hf"))
    root = tmp_path / "artifacts" / "text" / "1"
    root.mkdir(parents=True)
    limits = TokenLimits(names={"ids": "input_ids", "mask": "attention_mask"}, vocab_size=128, padding_id=0)
    manifest = Manifest(
        name="text",
        version=1,
        task="embedding",
        inputs=limits.apply(_specs()[:2]),
        outputs=[TensorSpec("embedding", "float32", ["batch", 32])],
    )
    artifact = Artifact(root, manifest)
    manifest.tokenizer, written = write_tokenizer(root, source)
    for rel in written:
        artifact.add_file(rel)
    artifact.save()

    loaded = Artifact.load(root)
    assert loaded.manifest.tokenizer is not None
    assert (loaded.manifest.tokenizer.file, loaded.manifest.tokenizer.config) == (TOKENIZER_FILE, TOKENIZER_CONFIG)
    assert {TOKENIZER_FILE, TOKENIZER_CONFIG} <= set(loaded.manifest.files)
    assert TokenLimits.read(loaded.manifest.inputs) == limits
    assert read_tokenizer(root / "tokenizer").vocab_size == source.vocab_size

    (root / TOKENIZER_FILE).write_text("{}")  # tampered: the hash no longer matches
    with pytest.raises(ArtifactError, match="tokenizer/tokenizer.json"):
        Artifact.load(root)


def test_a_tokenizer_record_without_its_files_or_an_ids_input_is_refused(tmp_path: Path) -> None:
    base = {
        "name": "text",
        "version": 1,
        "task": "embedding",
        "schema_version": 2,
        "inputs": [{"name": "x", "dtype": "float32", "shape": ["batch", 4]}],
        "outputs": [{"name": "y", "dtype": "float32", "shape": ["batch", 4]}],
        "tokenizer": {"file": TOKENIZER_FILE},
    }
    with pytest.raises(ArtifactError) as caught:
        Manifest.from_dict(base)
    assert "tokenizer.file: 'tokenizer/tokenizer.json' is not listed in files" in str(caught.value)
    assert "no input has tokens.role 'ids'" in str(caught.value)
    two_ids = {
        **base,
        "tokenizer": None,
        "inputs": [
            {"name": n, "dtype": "int64", "shape": ["batch", 4], "tokens": {"vocab_size": 9}} for n in ("a", "b")
        ],
    }
    with pytest.raises(ArtifactError, match=r"role: \['ids'\] given to more than one input"):
        Manifest.from_dict(two_ids)
