"""A CTC text recognizer's output -> text: numpy only, shared by the verifier, `pipe predict` and `pipe serve`.

A CTC recognizer (PaddleOCR's PP-OCR, a CRNN) answers [batch, positions, classes]: per position
(a column of the picture) a score for each class. One class is CTC's blank ("no character here");
every other class is one entry of the model's dictionary. Greedy decoding, as PaddleOCR's
`CTCLabelDecode` does it: the best class of each position, repeats merged (a character spanning
three columns is read once), blanks dropped; two equal characters in a row need a blank between
them. A text's confidence is the mean of its kept positions' best scores (probabilities: the
model's own when its rows are distributions, as PP-OCR's softmax output is, else a softmax), and 0
for an empty text, as Paddle gives.

`characters` is the class -> text table of the dictionary convention pipe records (the manifest's
`Ctc`: the blank's class, and a space class appended after the dictionary, PaddleOCR's
`use_space_char`): PaddleOCR's `ppocr_keys_v1` has 6,623 lines, and its models 6,625 classes:
blank, the 6,623 entries, a space. `encode` turns target texts into class sequences with the
same table; `text_figures` compares decoded sequences with targets or with another decoding: the
share of texts read exactly, and the character error rate (edit distance over the target's length).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

PAD = -1  # pads a target's class sequence to the longest one of its batch
SPACE = " "  # the class PaddleOCR appends after the dictionary (use_space_char)


@dataclass(frozen=True)
class Read:
    """One text as the model read it: its classes in order (blank and repeats gone) and its confidence."""

    classes: tuple[int, ...]
    confidence: float

    def text(self, characters: Sequence[str]) -> str:
        """The classes as text, each by `characters[class]` (an index past the table reads as '?')."""
        return "".join(characters[c] if 0 <= c < len(characters) else "?" for c in self.classes)


def greedy(scores: np.ndarray, blank: int = 0) -> list[Read]:
    """Each sample's text of a [batch, positions, classes] output: best class per position, repeats merged,
    blanks dropped; the confidence is the mean best probability of the positions kept (0 for no text)."""
    if scores.ndim != 3 or scores.shape[2] < 2:
        raise ValueError(f"a CTC output is [batch, positions, classes >= 2], got {list(scores.shape)}")
    best = scores.argmax(axis=2)  # [batch, positions]
    top = _best_probability(scores, best)
    keep = best != blank
    keep[:, 1:] &= best[:, 1:] != best[:, :-1]  # a class repeated in the next position is one character
    reads = []
    for row, kept, score in zip(best, keep, top, strict=True):
        chosen = score[kept]
        confidence = float(chosen.astype(np.float64).mean()) if chosen.size else 0.0
        reads.append(Read(tuple(row[kept].tolist()), confidence))
    return reads


def characters(dictionary: Sequence[str], blank: int = 0, space: bool = False) -> list[str]:
    """The text of each class: the dictionary's entries in order, a space after them when `space`, and ""
    for the blank at index `blank` (the entries after it move up one)."""
    table = [*dictionary, *([SPACE] if space else [])]
    return [*table[:blank], "", *table[blank:]]


def encode(texts: Sequence[str], table: Sequence[str], blank: int = 0) -> np.ndarray:
    """Target texts as class sequences [n, longest] padded with PAD, read with the dictionary's entries
    (longest entry first where entries are longer than one character). Raises ValueError naming the first
    text holding something the dictionary has no class for."""
    index: dict[str, int] = {}
    for i, entry in enumerate(table):
        if i != blank and entry:
            index.setdefault(entry, i)
    longest = max((len(e) for e in index), default=1)
    rows: list[list[int]] = []
    for n, text in enumerate(texts):
        row, at = [], 0
        while at < len(text):
            for size in range(min(longest, len(text) - at), 0, -1):
                if (found := index.get(text[at : at + size])) is not None:
                    row.append(found)
                    at += size
                    break
            else:
                raise ValueError(f"text {n} ({text[:40]!r}) holds {text[at]!r}, which the dictionary has no class for")
        rows.append(row)
    out = np.full((len(rows), max((len(r) for r in rows), default=0)), PAD, np.int64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


def sequences(padded: np.ndarray) -> list[tuple[int, ...]]:
    """The rows of a PAD-padded [n, length] array of classes (`encode`'s), padding left out."""
    return [tuple(int(c) for c in row if c != PAD) for row in padded.reshape(len(padded), -1)]


def edit_distance(a: Sequence[int], b: Sequence[int]) -> int:
    """Levenshtein distance: insertions, deletions and substitutions turning `a` into `b`."""
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


@dataclass(frozen=True)
class TextFigures:
    """Decoded texts against expected ones: how many were read exactly, and the characters in error."""

    texts: int
    exact: int  # texts whose classes equal the expected ones
    errors: int  # edits (insert, delete, substitute) over every text
    characters: int  # characters expected, over every text

    @property
    def agreement(self) -> float:
        """The share of texts read exactly (1.0 for no texts)."""
        return self.exact / self.texts if self.texts else 1.0

    @property
    def cer(self) -> float:
        """Character error rate: edits over expected characters (0 when both are empty, 1 per edit of none)."""
        return self.errors / self.characters if self.characters else float(self.errors)


def text_figures(got: Sequence[Sequence[int]], want: Sequence[Sequence[int]]) -> TextFigures:
    """`got` (decoded) against `want` (targets, or another model's decoding), text by text."""
    if len(got) != len(want):
        raise ValueError(f"{len(got)} texts read against {len(want)} expected")
    exact = sum(tuple(g) == tuple(w) for g, w in zip(got, want, strict=True))
    errors = sum(edit_distance(g, w) for g, w in zip(got, want, strict=True))
    return TextFigures(len(want), exact, errors, sum(len(w) for w in want))


def _best_probability(scores: np.ndarray, best: np.ndarray) -> np.ndarray:
    """The probability of each position's best class [batch, positions] (float64): the score itself when every
    row is a distribution (a softmax output), else its softmax's, 1 / sum(exp(score - best score))."""
    chosen = np.take_along_axis(scores, best[:, :, None], axis=2)[:, :, 0].astype(np.float64)
    sums = scores.sum(axis=-1, dtype=np.float64)
    if (scores >= 0).all() and np.allclose(sums, 1.0, atol=1e-3):
        return chosen
    return 1.0 / np.exp(scores.astype(np.float64) - chosen[:, :, None]).sum(axis=-1)
