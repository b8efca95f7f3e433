"""The token inputs of an imported ONNX graph: which inputs index an embedding, how large each table is, and
the limits `pipe import` records for them.

An integer input that reaches a Gather's indices (through Cast, Reshape, Unsqueeze and the like) indexes
that Gather's table, an initializer of [rows, width]: ids must stay below `rows`. Generated inputs draw
ids below it, token type ids 0 and masks 1, so a BERT (input_ids, attention_mask, token_type_ids: a
token-type table of 2 rows) runs on what the import makes up. Roles come from the input names
(pipeline/artifact/tokens.py, `guess_roles`); `--vocab-size`, `--padding-id`, `--max-length` and
`--tokenizer DIR` add what the graph does not say.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx

from pipeline.artifact.tensors import TensorSpec
from pipeline.artifact.tokens import TokenizerSource, TokenLimits, guess_roles, read_tokenizer
from pipeline.core.errors import InputError

PASS_THROUGH = {"Cast", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Expand"}  # ids flow through
DEFAULT_HIGH = 8  # ids drawn below this for an integer input of no known table: valid for any vocabulary


@dataclass(frozen=True)
class TokenOptions:
    """`pipe import --vocab-size --padding-id --max-length --tokenizer` for an ONNX token model."""

    vocab_size: int | None = None
    padding_id: int | None = None
    max_length: int | None = None
    tokenizer: Path | None = None

    @property
    def given(self) -> bool:
        return any(v is not None for v in (self.vocab_size, self.padding_id, self.max_length, self.tokenizer))


@dataclass(frozen=True)
class TokenModel:
    """What the import knows of a graph's token inputs."""

    limits: TokenLimits | None  # recorded on the inputs; None when no input is recognisably token ids
    tokenizer: TokenizerSource | None  # --tokenizer, carried into the artifact
    ranges: dict[str, tuple[int, int]]  # input -> [low, high) of the values generated for it


def embedding_rows(model: onnx.ModelProto) -> dict[str, int]:
    """Graph input -> rows of the smallest table it indexes (a Gather on axis 0 of an initializer)."""
    tables = {t.name: list(t.dims) for t in model.graph.initializer}
    for node in model.graph.node:  # a Constant holding the table
        if node.op_type == "Constant" and node.attribute and node.attribute[0].type == onnx.AttributeProto.TENSOR:
            tables[node.output[0]] = list(node.attribute[0].t.dims)
    inputs = {v.name for v in model.graph.input} - set(tables)
    origin = {name: name for name in inputs}  # value -> the graph input it carries unchanged in value
    for node in model.graph.node:  # nodes are in topological order
        if node.op_type in PASS_THROUGH and node.input and node.input[0] in origin:
            for out in node.output:
                origin[out] = origin[node.input[0]]
    rows: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type != "Gather" or len(node.input) < 2 or node.input[1] not in origin:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        table = tables.get(node.input[0])
        if axis == 0 and table and table[0] > 0:
            name = origin[node.input[1]]
            rows[name] = min(rows.get(name, table[0]), table[0])
    return rows


def token_model(model: onnx.ModelProto, inputs: list[TensorSpec], options: TokenOptions) -> TokenModel:
    """The token inputs of `model`, their limits (the graph's tables, then the flags) and generated ranges."""
    rows = embedding_rows(model)
    integer = [s.name for s in inputs if s.dtype.startswith(("int", "uint")) and len(s.shape) == 2]
    roles = guess_roles(integer)
    if not roles and options.given:
        raise InputError(
            f"--vocab-size, --padding-id, --max-length and --tokenizer describe token-id inputs, but none of the "
            f"inputs {[s.name for s in inputs]} is recognisably one (an integer [batch, sequence] input named "
            "input_ids, ids or tokens)"
        )
    ranges = {name: (0, rows.get(name, DEFAULT_HIGH)) for name in integer}
    if "mask" in roles:
        ranges[roles["mask"]] = (1, 2)  # every token real
    if "type_ids" in roles:
        ranges[roles["type_ids"]] = (0, 1)  # one segment
    if not roles or (roles["ids"] not in rows and not options.given):
        return TokenModel(None, None, ranges)
    tokenizer = read_tokenizer(options.tokenizer) if options.tokenizer is not None else None
    ids = roles["ids"]
    vocab = options.vocab_size or rows.get(ids) or (tokenizer.vocab_size if tokenizer else None)
    if vocab is None:
        raise InputError(
            f"input {ids!r} indexes no embedding table pipe can read in the graph; give its vocabulary with "
            "--vocab-size"
        )
    if ids in rows and vocab > rows[ids]:
        raise InputError(f"--vocab-size {vocab}: input {ids!r} indexes a table of {rows[ids]} rows in the graph")
    if tokenizer is not None and tokenizer.vocab_size > vocab:
        raise InputError(
            f"--tokenizer {options.tokenizer}: it makes {tokenizer.vocab_size} ids but the model embeds {vocab}; "
            "pass the tokenizer the model was trained with"
        )
    padding = options.padding_id if options.padding_id is not None else tokenizer.padding_id if tokenizer else None
    if padding is not None and not 0 <= padding < vocab:
        raise InputError(f"--padding-id {padding} is not an id in [0, {vocab})")
    types = roles.get("type_ids")
    limits = TokenLimits(
        names=roles,
        vocab_size=vocab,
        padding_id=padding,
        max_length=options.max_length or (tokenizer.max_length if tokenizer else None),
        type_count=(rows.get(types) or 1) if types else None,
    )
    ranges[ids] = (0, vocab)
    return TokenModel(limits, tokenizer, ranges)
