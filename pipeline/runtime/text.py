"""Texts into a token model's inputs, with the tokenizer its artifact carries (pipeline/artifact/tokens.py).

The `tokenizers` library alone (Rust, no torch, no transformers), so `pipe serve` tokenizes in its own
process. A text is cut to the ids input's `max_length` on the recorded side; rows are padded to the
longest row of the batch on the recorded side: ids with the padding id, the mask and token types with 0.

Before it is tokenized, a text is cut to `max_chars` characters on the same side: `max_length` x
CHARS_PER_TOKEN (WordPiece reads a word of more than 100 characters as one unknown token, and
BPE tokens are far shorter), or MAX_CHARS when no max length is recorded. The tokenizer makes every
overflow window of a truncated text (9.5 MB of text took a server from 85 MB to 1.77 GB); cut first,
a text costs at most a few windows, whatever its length. A tokenizer that fails on a text (its
Rust code panics, e.g. a regex that backtracks past its limit: pyo3's PanicException, a
BaseException) is an InputError naming the text's row, for `pipe serve` and `pipe import` alike.
Shared by `pipe serve`, `pipe predict --text` and `pipe import DIR` (its golden inputs are real text
tokenized exactly as a served request is).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.artifact.tokens import TokenizerRecord, TokenLimits
from pipeline.core.errors import ArtifactError, InputError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from pipeline.artifact.manifest import Manifest

Row = dict[str, np.ndarray]  # input name -> one text's values, [length]
CHARS_PER_TOKEN = 100  # characters kept per token of max_length when a text is cut before tokenizing
MAX_CHARS = 1_000_000  # characters kept of a text for a model that records no max length


@dataclass
class TextEncoder:
    """A loaded tokenizer and where its ids, mask and token types go."""

    tokenizer: Tokenizer  # truncation set, padding off (rows are padded per batch)
    limits: TokenLimits
    padding_side: str = "right"

    @classmethod
    def load(cls, path: Path, limits: TokenLimits, record: TokenizerRecord) -> TextEncoder:
        """The tokenizer file at `path`, cut to `limits.max_length`; ArtifactError when it does not load."""
        from tokenizers import Tokenizer

        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # the tokenizers library raises a bare Exception for a bad file
            raise ArtifactError(f"tokenizer {path} does not load: {str(exc).splitlines()[0][:200]}") from None
        tokenizer.no_padding()
        if limits.max_length is not None:
            tokenizer.enable_truncation(limits.max_length, direction=record.truncation_side)
        else:
            tokenizer.no_truncation()
        return cls(tokenizer, limits, record.padding_side)

    @classmethod
    def of(cls, root: Path, manifest: Manifest) -> TextEncoder | None:
        """The encoder of the artifact at `root`, or None for a model that takes no text."""
        record = manifest.tokenizer
        limits = TokenLimits.read(manifest.inputs)
        if record is None or limits is None:
            return None
        return cls.load(Path(root) / record.file, limits, record)

    @property
    def max_chars(self) -> int:
        """The characters of a text that are tokenized; the rest cannot reach the model's max length."""
        length = self.limits.max_length
        return length * CHARS_PER_TOKEN if length is not None else MAX_CHARS

    @property
    def truncation_side(self) -> str:
        truncation = self.tokenizer.truncation
        return truncation["direction"] if truncation else "right"

    def cut(self, text: str) -> str:
        """`text` cut to `max_chars` on the side truncation drops tokens from (the kept side unchanged)."""
        if len(text) <= self.max_chars:
            return text
        return text[-self.max_chars :] if self.truncation_side == "left" else text[: self.max_chars]

    def rows(self, texts: list[str]) -> list[Row]:
        """Each text tokenized alone, unpadded: what a batch across requests is padded from."""
        made = []
        for enc in self._encodings(texts):
            made.append({name: np.asarray(getattr(enc, field), dtype=np.int64) for name, field in self._fields()})
        return made

    def encode(self, texts: list[str]) -> dict[str, np.ndarray]:
        """Texts -> the model's token inputs, [len(texts), longest row], padded on the recorded side."""
        if not texts:
            raise InputError("no texts to encode: give at least one")
        encodings = self._encodings(texts)
        longest = max(len(enc.ids) for enc in encodings)
        padding = self.padding_values()
        batch = {}
        for name, field in self._fields():  # lists padded in Python, then one array: a few us a text
            rows = [getattr(enc, field) for enc in encodings]
            if any(len(row) != longest for row in rows):
                fill = [padding[name]]
                if self.padding_side == "left":
                    rows = [fill * (longest - len(row)) + row for row in rows]
                else:
                    rows = [row + fill * (longest - len(row)) for row in rows]
            batch[name] = np.array(rows, dtype=np.int64)
        return batch

    def _encodings(self, texts: list[str]) -> list[Any]:
        """Each text cut, then tokenized; the Encodings alone are kept (their overflow windows go with them)."""
        cut = [self.cut(text) for text in texts]
        try:
            # one text: encode (no batch machinery, about half the time of encode_batch for a short text)
            return [self.tokenizer.encode(cut[0])] if len(cut) == 1 else self.tokenizer.encode_batch(cut)
        except BaseException as exc:  # a bare Exception, or pyo3's PanicException (its Rust code panicked)
            if not _tokenizer_failure(exc):
                raise  # KeyboardInterrupt, SystemExit
            failure = exc
        row = next((i for i, text in enumerate(cut) if self._fails(text)), 0) if len(cut) > 1 else 0
        reason = (str(failure).splitlines() or [""])[0][:200] or type(failure).__name__
        raise InputError(
            f"the tokenizer failed on text {row} ({reason}); the artifact's tokenizer cannot tokenize it: change "
            "the text, or fix the tokenizer"
        )

    def _fails(self, text: str) -> bool:
        try:
            self.tokenizer.encode(text)
        except BaseException as exc:
            if not _tokenizer_failure(exc):
                raise
            return True
        return False

    def _fields(self) -> list[tuple[str, str]]:
        """(input name, the Encoding attribute that fills it), by role."""
        names = self.limits.names
        fields = {"ids": "ids", "mask": "attention_mask", "type_ids": "type_ids"}
        return [(names[role], field) for role, field in fields.items() if role in names]

    def padding_values(self) -> dict[str, int]:
        """Input name -> the value a short row is filled with."""
        names = self.limits.names
        values = {names["ids"]: self.limits.padding_id or 0}
        values |= {names[role]: 0 for role in ("mask", "type_ids") if role in names}
        return values


def _tokenizer_failure(exc: BaseException) -> bool:
    """Whether the tokenizers library failed: a bare Exception, or pyo3's PanicException (a BaseException)."""
    return isinstance(exc, Exception) or type(exc).__name__ == "PanicException"


def pad_rows(rows: list[Row], padding: dict[str, int], side: str = "right") -> dict[str, np.ndarray]:
    """Rows of different lengths -> one batch per input, [rows, longest], short rows filled with `padding`."""
    longest = max(len(next(iter(row.values()))) for row in rows)
    batch = {}
    for name, value in padding.items():
        out = np.full((len(rows), longest), value, dtype=np.int64)
        for i, row in enumerate(rows):
            n = len(row[name])
            if side == "left":
                out[i, longest - n :] = row[name]
            else:
                out[i, :n] = row[name]
        batch[name] = out
    return batch
