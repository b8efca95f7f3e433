"""A tiny text model that needs no torch: a word-level tokenizer written with the `tokenizers` library and a
mean-of-embeddings ONNX graph, brought together by `pipe import MODEL.onnx --tokenizer DIR` (`import_onnx`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from pipeline.export.importer import import_onnx
from pipeline.export.token_graph import TokenOptions

WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran"]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
VOCAB = len(SPECIALS) + len(WORDS)
MAX_LENGTH = 16
DIM = 4


def save_tokenizer(directory: Path, backtracking: bool = False) -> Path:
    """[CLS] words [SEP], [PAD] = 0; `backtracking`: a pre-tokenizer regex `(a+)+$` that makes the Rust
    regex engine give up (and the tokenizer panic) on a long run of a's not at the end."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors

    vocab = {token: i for i, token in enumerate([*SPECIALS, *WORDS])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    split = pre_tokenizers.Whitespace()
    if backtracking:
        split = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex("(a+)+$"), "isolated"), split])
    tokenizer.pre_tokenizer = split
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])]
    )
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"pad_token": "[PAD]", "model_max_length": MAX_LENGTH}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def mean_embedding() -> onnx.ModelProto:
    """input_ids, attention_mask INT64 [batch, sequence] -> embedding FP32 [batch, DIM]: the masked sum of
    each token's row of a table."""
    table = np.random.default_rng(0).normal(size=(VOCAB, DIM)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["rows"]),
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["maskf", "last"], ["mask3"]),
        helper.make_node("Mul", ["rows", "mask3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "second"], ["embedding"], keepdims=0),
    ]
    dims = ["batch", "sequence"]
    graph = helper.make_graph(
        nodes,
        "mean_embedding",
        [helper.make_tensor_value_info(n, TensorProto.INT64, dims) for n in ("input_ids", "attention_mask")],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", DIM])],
        [
            numpy_helper.from_array(table, "table"),
            numpy_helper.from_array(np.array([-1], np.int64), "last"),
            numpy_helper.from_array(np.array([1], np.int64), "second"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def import_text_model(repo: Path, name: str, scratch: Path, backtracking: bool = False) -> Path:
    """artifacts/<name>/1: the graph with its tokenizer, as `pipe import` makes it; returns the version."""
    scratch.mkdir(parents=True, exist_ok=True)
    source = scratch / f"{name}.onnx"
    onnx.save(mean_embedding(), source)
    tokens = TokenOptions(tokenizer=save_tokenizer(scratch / f"{name}-tokenizer", backtracking))
    return import_onnx(source, name, repo, tokens=tokens).root
