"""Field checks the artifact's dataclasses share (`field(metadata={"check": ...})`, pipeline/core/jsontypes.py).

Each takes a field's value and returns None when it is fine, else the problem in a few words; the
decoder prefixes the field's dotted path. Standard library only.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable

UNPRINTABLE = ("Cc", "Cf", "Zl", "Zp")  # Unicode categories no name or label may hold


def one_of(allowed: tuple[str, ...]) -> Callable[[str], str | None]:
    """A check that the value is one of `allowed`."""

    def check(value: str) -> str | None:
        return None if value in allowed else f"{value[:40]!r} is not one of {', '.join(allowed)}"

    return check


def positive(value: int | None) -> str | None:
    return None if value is None or value >= 1 else f"expected a number >= 1, got {value}"


def non_negative(value: int | None) -> str | None:
    return None if value is None or value >= 0 else f"expected a number >= 0, got {value}"


def token_ids(values: list[int]) -> str | None:
    """A list of token ids: none negative."""
    negative = [v for v in values if v < 0]
    return f"token ids are >= 0, got {negative[:3]}" if negative else None


def unprintable(text: str) -> str:
    """The control and format characters in `text` (newline, tab, NUL, a byte-order mark, a zero-width space)."""
    return ", ".join(repr(ch) for ch in sorted({ch for ch in text if unicodedata.category(ch) in UNPRINTABLE}))
