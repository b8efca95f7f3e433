"""Lines of a text file, each bounded: a file's longest line is read only up to a cap.

A CSV or JSONL file is read a line at a time, and Python reads a whole line into memory before the
csv module or the JSON parser sees it: one 2 GB line (a file with no newline, or one forged cell) was
a MemoryError, exit 3. `bounded_lines` reads at most `limit` characters of a line and refuses a
longer one with its line number and the cap.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from pipeline.core.errors import InputError

MAX_LINE_CHARS = 16 * 1024 * 1024  # 16 Mi characters: a row of 100,000 numbers is ~1 M; past this it is no table


def bounded_lines(f: TextIO, path: Path, limit: int = MAX_LINE_CHARS) -> Iterator[str]:
    """The lines of `f` (newlines kept, as csv.reader takes them); InputError at the first longer than `limit`."""
    number = 0
    while line := f.readline(limit + 1):
        number += 1
        if len(line) > limit and not (len(line) == limit + 1 and line.endswith("\n")):
            raise InputError(
                f"{path} line {number} is longer than {limit:,} characters (read no further); a table's row is "
                "shorter: check the file is the CSV or JSONL meant (line breaks intact), or split the data"
            )
        yield line
