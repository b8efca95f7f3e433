"""Language-model training rows: plain text packed into blocks, conversations rendered with the chat template.

- `pack_text`: plain text for (continued) pre-training, tokenized and cut into blocks of `block` tokens
  (each block: ids [block], every token labelled).
- `tokenize_conversations`: instruction data (pipeline/data/instructions.py) rendered with the model's
  chat template; only the assistant's turns are labelled (the template's text around them and the
  user's words are IGNORE), found by character offsets, so a merge across the turn's edge cannot shift
  them. Rows are right-padded; padding is unlabelled and masked.
- `lm_rows`: the recipe's data file read and tokenized by its format (text, alpaca, sharegpt).

The tokenizer is a transformers fast tokenizer (it renders chat templates); numpy otherwise, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.errors import InputError
from pipeline.data.instructions import Message, read_conversations, read_plain_text

IGNORE = -100  # the label of a token the loss skips (torch's cross_entropy ignore_index)
DEFAULT_BLOCK = 128  # tokens per row when data.max_length is not set


@dataclass
class LMRows:
    """Token rows for a causal LM: what the model reads and which next tokens it is scored on."""

    ids: np.ndarray  # [n, T] int64
    mask: np.ndarray  # [n, T] int64: 1 for a real token
    labels: np.ndarray  # [n, T] int64: the token itself where it counts, IGNORE elsewhere

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, rows: np.ndarray | slice) -> LMRows:
        return LMRows(self.ids[rows], self.mask[rows], self.labels[rows])


def pack_text(tokenizer: Any, texts: list[str], block: int, eos_id: int | None) -> LMRows:
    """Texts tokenized (each followed by EOS when given) and cut into blocks of `block` tokens; the tail is dropped."""
    stream: list[int] = []
    for text in texts:
        stream += tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]  # longer than a row: packed
        if eos_id is not None:
            stream.append(eos_id)
    count = len(stream) // block
    if count == 0:
        raise InputError(f"the text makes {len(stream)} tokens, fewer than one block of {block}; give more text")
    ids = np.asarray(stream[: count * block], dtype=np.int64).reshape(count, block)
    return LMRows(ids, np.ones_like(ids), ids.copy())


def tokenize_conversations(tokenizer: Any, conversations: list[list[Message]], max_length: int) -> LMRows:
    """Conversations rendered with the chat template, labels on the assistant's turns only, right-padded.

    A row longer than `max_length` is cut on the right; a row left with no labelled token is refused."""
    if not getattr(tokenizer, "chat_template", None):
        raise InputError(
            "instruction data needs the model's chat template, and its tokenizer has none; add chat_template to "
            "tokenizer_config.json (or chat_template.jinja), or train on plain text"
        )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rows: list[tuple[list[int], list[int]]] = []
    for n, messages in enumerate(conversations):
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        spans = _answer_spans(tokenizer, messages)
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = enc["input_ids"][:max_length]
        labels = [
            tok if any(lo <= start < hi for lo, hi in spans) else IGNORE
            for tok, (start, _) in zip(ids, enc["offset_mapping"], strict=False)
        ]
        if all(x == IGNORE for x in labels):
            raise InputError(
                f"conversation {n + 1}: no answer token within max_length {max_length}; raise max_length or "
                "shorten the prompt"
            )
        rows.append((ids, labels))
    longest = max(len(ids) for ids, _ in rows)
    ids = np.full((len(rows), longest), pad, dtype=np.int64)
    labels = np.full((len(rows), longest), IGNORE, dtype=np.int64)
    mask = np.zeros((len(rows), longest), dtype=np.int64)
    for i, (row, lab) in enumerate(rows):
        ids[i, : len(row)], labels[i, : len(row)], mask[i, : len(row)] = row, lab, 1
    return LMRows(ids, mask, labels)


def _answer_spans(tokenizer: Any, messages: list[Message]) -> list[tuple[int, int]]:
    """Character spans of the rendered conversation that the assistant wrote, each with what the template
    closes its turn with (the EOS the model must learn to say), up to the next turn's start."""
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = tokenizer.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True)
        through = tokenizer.apply_chat_template(messages[: i + 1], tokenize=False)
        spans.append((len(before), len(through)))
    return spans


def lm_rows(path: Path, fmt: str | None, model_dir: Path, max_length: int | None) -> tuple[LMRows, str]:
    """The data file at `path` as training rows for the causal LM in `model_dir`, and the format read.

    `fmt`: text (a .txt file, packed into blocks of `max_length`, 128 by default), alpaca or sharegpt
    (a .json or .jsonl file); None: text for .txt, else found from the first row."""
    from transformers import PreTrainedTokenizerFast

    if not (model_dir / "tokenizer.json").is_file():
        raise InputError(f"{model_dir} holds no tokenizer.json: a causal LM trains with its own fast tokenizer")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    fmt = fmt or ("text" if path.suffix.lower() == ".txt" else None)
    length = max_length or DEFAULT_BLOCK
    if fmt == "text":
        rows = pack_text(tokenizer, read_plain_text([path]), length, tokenizer.eos_token_id)
        return rows, "text"
    conversations = read_conversations(path, fmt)  # type: ignore[arg-type]  # checked by the recipe schema
    return tokenize_conversations(tokenizer, conversations, length), fmt or "alpaca or sharegpt"
