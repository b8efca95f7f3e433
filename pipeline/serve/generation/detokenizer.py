"""Token ids into text as they come, never splitting a character.

A byte-level BPE token may hold part of a UTF-8 character, and a SentencePiece-style decoder drops or
adds a word's leading space depending on what comes before. So the new text of a token is read as the
difference of two decodings over a short window of the ids before it (the `tokenizers` library's
`decode`, special tokens skipped), and held back while the window's text ends in U+FFFD (a character
still incomplete): the streamed pieces join to exactly the whole answer decoded at once. The window
starts on the prompt's last tokens, so the first word's spacing is the one it has after the prompt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenizers import Tokenizer

PROMPT_WINDOW = 5  # prompt tokens the first decodings start from
REPLACEMENT = "\ufffd"


class Detokenizer:
    """One sequence's text, token by token."""

    def __init__(self, tokenizer: Tokenizer, prompt: list[int]) -> None:
        self._tokenizer = tokenizer
        self._ids = list(prompt[-PROMPT_WINDOW:])
        self._prefix = 0  # the window's start
        self._read = len(self._ids)  # ids before this are already text

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True)

    def add(self, token: int) -> str:
        """The text `token` completes ('' while a character is still incomplete)."""
        self._ids.append(token)
        return self._advance(final=False)

    def flush(self) -> str:
        """What is still held back (an incomplete character at the end: its replacement character)."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        if self._read == len(self._ids):
            return ""
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        if len(after) <= len(before) or (after.endswith(REPLACEMENT) and not final):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return after[len(before) :]
