"""The manifest's token-id input spec: training records the vocabulary, longest sequence and padding id."""

from __future__ import annotations

from pipeline.artifact.tensors import TokenInput
from pipeline.data import DataInfo
from pipeline.recipe.architectures import TransformerSpec
from pipeline.train.finish import input_spec

TOKENS = DataInfo("tokens", [32], 4, ["none", "a", "b", "both"], vocab_size=60)


def test_token_input_records_the_embeddings_limits() -> None:
    spec = input_spec(TOKENS, TransformerSpec(arch="transformer", d_model=16, heads=2, max_len=48))
    assert (spec.name, spec.dtype, spec.layout) == ("tokens", "int64", "NT")
    assert spec.tokens == TokenInput(vocab_size=60, max_length=48, padding_id=0)  # the data's ids, model.max_len
    assert spec.preprocessing == {}  # the limits live in the typed record only


def test_the_recipes_vocab_size_wins_over_the_datas() -> None:
    model = TransformerSpec(arch="transformer", d_model=16, heads=2, max_len=32, vocab_size=100)
    assert input_spec(TOKENS, model).tokens == TokenInput(vocab_size=100, max_length=32, padding_id=0)


def test_other_inputs_have_no_token_record() -> None:
    features = DataInfo("features", [64], 10, [str(i) for i in range(10)])
    assert input_spec(features, TransformerSpec(arch="transformer")).tokens is None
