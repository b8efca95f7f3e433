"""`pipe import DIR --eval-data texts.txt`: a transformers model's evaluation data, as the user's own texts.

A text model takes text, so its real inputs are texts: a UTF-8 file, one text per line (blank lines
skipped), at most `limit` of them (the first). They are tokenized as a served request is
(`pipeline/runtime/text.py`) and become golden.npz, so the import record says `golden: eval-data`:
optimize calibrates static int8 on them and every hop is judged over them, not on pipe's eight
built-in sentences.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import InputError

SUFFIXES = (".txt",)  # one text per line; anything else is refused, naming the format


@dataclass(frozen=True)
class Texts:
    """The texts read, where from, and the sha256 of the file (the import record's `inputs.eval_data`)."""

    texts: list[str]
    path: Path
    digest: str
    skipped: int  # texts past the limit


def read_texts(path: Path, limit: int) -> Texts:
    """The non-blank lines of `path` (at most `limit`), refused by name when it is not a UTF-8 text file."""
    path = Path(path)
    if path.suffix.lower() not in SUFFIXES or not path.is_file():
        what = "a folder" if path.is_dir() else ("missing" if not path.exists() else f"a {path.suffix or 'bare'} file")
        raise InputError(
            f"--eval-data {path} is {what}; a transformers model takes its evaluation data as texts: a UTF-8 "
            ".txt file, one text per line (e.g. --eval-data sentences.txt)"
        )
    data = path.read_bytes()
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise InputError(f"--eval-data {path} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    texts = [line.strip() for line in lines if line.strip()]
    if not texts:
        raise InputError(f"--eval-data {path} holds no text; give one text per line")
    return Texts(texts[:limit], path, hashlib.sha256(data).hexdigest(), max(0, len(texts) - limit))
