"""Text data for transformers models: a CSV or JSONL file of texts and labels, tokenized as served.

    data: {source: text, path: reviews.csv, text_column: text, label_column: label, max_length: 128}

A `.csv` file has a header row naming its columns; a `.jsonl` file holds one JSON object per line
keyed the same way. Every row needs a non-empty text and a label. The texts are tokenized with the
model directory's own tokenizer (`tokenizer.json`, read by the `tokenizers` library, the one the
server tokenizes with), truncated by it to `max_length` tokens on its truncation side (the model's
limit when unset: its `max_position_embeddings` and the tokenizer's `model_max_length`), and padded
with the tokenizer's padding id to the longest row on its padding side. Each problem names the file
and the line.

The tokenizer is read once, here, and the directory's digest (`base_digest`) taken with its bytes:
the version written at the end of training carries that tokenizer and that digest (`TextBase`), not
the directory as it is by then, so a tokenizer swapped during a run cannot pair with the ids trained on.
"""

from __future__ import annotations

import csv
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pipeline.core.errors import InputError
from pipeline.data.lines import MAX_LINE_CHARS, bounded_lines

if TYPE_CHECKING:
    from pipeline.artifact.tokens import TokenizerSource

TEXT_SUFFIXES = (".csv", ".jsonl")
DEFAULT_TEXT_COLUMN = "text"
DEFAULT_LABEL_COLUMN = "label"
# What makes a transformers directory the model it is: its config, weights and tokenizer files.
BASE_FILES = ("config.json", "*.safetensors", "*.bin", "tokenizer.json", "tokenizer_config.json")


@dataclass(frozen=True)
class TextBase:
    """The transformers directory the texts were tokenized with, as it was then: its tokenizer (the
    bytes read, which the version carries) and its digest (the train record's `base_model`)."""

    tokenizer: TokenizerSource
    digest: str


@dataclass
class Tokenized:
    """Texts as a model takes them: ids and attention mask, padded to the longest row."""

    ids: np.ndarray  # [n, T] int64 token ids, padded with padding_id
    mask: np.ndarray  # [n, T] int64: 1 for a real token, 0 for padding
    padding_id: int
    vocab_size: int  # ids the model embeds (config.json vocab_size): every id is below it
    max_length: int  # the longest row the model takes (what serving truncates to)
    truncated: int  # rows cut to max_length
    base: TextBase  # the tokenizer that made the ids, and the directory's digest when it did


def read_texts(
    path: Path, text_column: str, label_column: str, max_line: int = MAX_LINE_CHARS
) -> tuple[list[str], list[str]]:
    """The texts and their labels (as written) from a .csv or .jsonl file, in file order; `max_line`: the
    longest line read, in characters (a longer one is refused, not read whole)."""
    suffix = path.suffix.lower()
    if suffix not in TEXT_SUFFIXES:
        raise InputError(
            f"{path}: source 'text' reads {' or '.join(TEXT_SUFFIXES)} files (a header row and one text per row, or "
            f"one JSON object per line); got {suffix or 'no suffix'!r}"
        )
    rows = _csv_rows(path, max_line) if suffix == ".csv" else _jsonl_rows(path, max_line)
    texts, labels = [], []
    for line, row in rows:
        for column in (text_column, label_column):
            if column not in row:
                raise InputError(
                    f"{path} line {line}: no {column!r} column (it has {sorted(row)}); set data.text_column and "
                    "data.label_column to the columns holding the text and the label"
                )
        text, label = row[text_column], row[label_column]
        if not isinstance(text, str) or not text.strip():
            raise InputError(f"{path} line {line}: column {text_column!r} holds {text!r}, not a text; fill or drop it")
        if label is None or isinstance(label, dict | list) or str(label).strip() == "":
            raise InputError(f"{path} line {line}: column {label_column!r} holds {label!r}, not a label")
        texts.append(text)
        labels.append(str(label))
    if not texts:
        raise InputError(f"{path} holds no rows of text")
    return texts, labels


def _csv_rows(path: Path, max_line: int) -> list[tuple[int, dict[str, object]]]:
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(bounded_lines(f, path, max_line))
            return [(reader.line_num, dict(row)) for row in reader]
    except (UnicodeDecodeError, csv.Error) as exc:
        raise InputError(f"{path} is not a readable UTF-8 CSV file ({exc})") from None


def _jsonl_rows(path: Path, max_line: int) -> list[tuple[int, dict[str, object]]]:
    try:
        with open(path, encoding="utf-8-sig") as f:
            lines = list(bounded_lines(f, path, max_line))
    except UnicodeDecodeError as exc:
        raise InputError(f"{path} is not UTF-8 text ({exc})") from None
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError) as exc:  # also a 5,000-digit integer, and nesting past the parser's
            raise InputError(
                f"{path} line {number} is not JSON this reader takes ({str(exc)[:120]}); write one JSON object per "
                "line, numbers of at most 4,300 digits, nested no deeper than a few hundred levels"
            ) from None
        if not isinstance(row, dict):
            raise InputError(f"{path} line {number} holds a JSON {type(row).__name__}, not an object of columns")
        rows.append((number, row))
    return rows


def tokenize(texts: list[str], model_dir: Path, max_length: int | None) -> Tokenized:
    """`texts` through the model directory's tokenizer: truncated to the model's limit, padded to the longest row."""
    import importlib.util

    from pipeline.artifact.tokens import hf_limits, read_tokenizer

    if importlib.util.find_spec("tokenizers") is None:
        raise InputError("data.source text needs tokenizers, which is not installed; pip install '.[hf]'")

    source = read_tokenizer(model_dir)
    limits = hf_limits(model_dir, ["input_ids", "attention_mask"], source)
    if limits.padding_id is None:
        raise InputError(
            f"{model_dir}: the tokenizer names no padding token (tokenizer_config.json pad_token) and config.json "
            "no pad_token_id; set one, so rows of different lengths can be batched"
        )
    longest = limits.max_length
    if max_length is not None and longest is not None and max_length > longest:
        raise InputError(
            f"data.max_length {max_length} is past what {model_dir} takes ({longest} tokens: max_position_embeddings "
            f"or model_max_length); set data.max_length <= {longest} or remove it"
        )
    cut = max_length or longest
    if cut is None:
        raise InputError(f"{model_dir} states no maximum length; set data.max_length")
    tokenizer = source.tokenizer()  # the bytes read above, whatever the directory holds by now
    tokenizer.no_padding()  # padded below, to the longest row of the whole set
    # truncation by the tokenizer itself keeps the special tokens its post-processor adds ([CLS] ... [SEP])
    tokenizer.enable_truncation(cut, direction=source.truncation_side)
    encodings = tokenizer.encode_batch(texts)
    truncated = sum(bool(e.overflowing) for e in encodings)
    rows = [e.ids for e in encodings]
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), limits.padding_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for i, row in enumerate(rows):  # padded on the tokenizer's side, as the server pads a batch
        where = slice(width - len(row), width) if source.padding_side == "left" else slice(0, len(row))
        ids[i, where] = row
        mask[i, where] = 1
    if ids.max() >= limits.vocab_size:
        raise InputError(
            f"{model_dir}: the tokenizer made id {int(ids.max())} but the model embeds {limits.vocab_size} ids "
            "(config.json vocab_size): the tokenizer is not the model's"
        )
    base = TextBase(source, base_digest(model_dir, source.contents))
    return Tokenized(ids, mask, limits.padding_id, limits.vocab_size, cut, truncated, base)


def base_digest(model_dir: Path, read: dict[str, bytes] | None = None) -> str:
    """sha256 over the directory's config, weight and tokenizer files (names and bytes): what LoRA builds on.

    `read`: files already read (the tokenizer's, by name), hashed as they were read.
    """
    read = read or {}
    digest = hashlib.sha256()
    files = sorted({p for pattern in BASE_FILES for p in model_dir.glob(pattern) if p.is_file()} |
                   {model_dir / name for name in read if name in BASE_FILES})  # fmt: skip
    for path in files:
        digest.update(path.name.encode() + b"\0")
        if path.name in read:
            digest.update(read[path.name])
            continue
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()
