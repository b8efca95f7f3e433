"""Language-model training data: plain text, and instruction data in the two formats LLaMA-Factory users have.

- **text**: a `.txt` file (or several), read whole: continued pre-training packs it into blocks.
- **alpaca**: a `.json` list or `.jsonl` lines of `{"instruction", "input"?, "output", "system"?}`; the
  instruction and its input (joined by a blank line) are the user's turn, the output the assistant's.
- **sharegpt**: `{"conversations": [{"from": "human" | "gpt" | "system", "value": ...}]}` (ShareGPT), or
  `{"messages": [{"role": "user" | "assistant" | "system", "content": ...}]}` (OpenAI messages).

Each instruction row becomes a conversation, a list of `{"role", "content"}` messages, which the model's
chat template renders; the loss then falls on the assistant's turns alone (pipeline/train/causal_lm.py).
Each problem names the file and the row. Standard library only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pipeline.core.errors import InputError

Format = Literal["text", "alpaca", "sharegpt"]
FORMATS: tuple[Format, ...] = ("text", "alpaca", "sharegpt")
Message = dict[str, str]  # {"role": "system" | "user" | "assistant", "content": ...}
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


def read_plain_text(paths: list[Path]) -> list[str]:
    """The files' texts, one per file (UTF-8; undecodable bytes replaced, as documentation often holds them)."""
    texts = []
    for path in paths:
        if not path.is_file():
            raise InputError(f"{path}: no such text file")
        texts.append(path.read_text(encoding="utf-8", errors="replace"))
    if not any(t.strip() for t in texts):
        raise InputError(f"{[str(p) for p in paths][:3]} hold no text")
    return texts


def read_conversations(path: Path, fmt: Format | None = None) -> list[list[Message]]:
    """The instruction rows of an alpaca or sharegpt file as conversations; `fmt` None: found from the first row."""
    rows = _rows(path)
    if not rows:
        raise InputError(f"{path} holds no rows")
    fmt = fmt or detect_format(rows[0], path)
    if fmt == "text":
        raise InputError(f"{path}: format 'text' is plain text, read with read_plain_text, not rows")
    read = _alpaca if fmt == "alpaca" else _sharegpt
    return [read(row, path, i + 1) for i, row in enumerate(rows)]


def detect_format(row: Any, path: Path) -> Format:
    """alpaca for a row with `instruction` and `output`; sharegpt for one with `conversations` or `messages`."""
    if isinstance(row, dict) and "instruction" in row and "output" in row:
        return "alpaca"
    if isinstance(row, dict) and ("conversations" in row or "messages" in row):
        return "sharegpt"
    keys = sorted(row)[:8] if isinstance(row, dict) else type(row).__name__
    raise InputError(
        f"{path} row 1 ({keys}) is neither alpaca ({{instruction, input, output}}) nor sharegpt ({{conversations: "
        "[{from, value}]}} or {messages: [{role, content}]}); convert it to one of them"
    )


def _rows(path: Path) -> list[Any]:
    """A .json list, or .jsonl lines (blank lines skipped)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path} is not a readable UTF-8 file ({exc})") from None
    if path.suffix.lower() == ".jsonl":
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError as exc:
                    raise InputError(f"{path} line {n} is not JSON: {str(exc)[:120]}") from None
        return rows
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InputError(f"{path} is not JSON: {str(exc)[:120]}") from None
    if not isinstance(data, list):
        raise InputError(f"{path}: expected a JSON list of rows (or a .jsonl file), got {type(data).__name__}")
    return data


def _text(row: dict[str, Any], key: str, path: Path, n: int, required: bool = True) -> str:
    value = row.get(key, "")
    if value is None:
        value = ""
    if not isinstance(value, str) or (required and not value.strip()):
        raise InputError(f"{path} row {n}: {key!r} holds {str(value)[:60]!r}, not a text; fill or drop the row")
    return value


def _alpaca(row: Any, path: Path, n: int) -> list[Message]:
    if not isinstance(row, dict):
        raise InputError(f"{path} row {n}: expected an object with instruction and output")
    instruction = _text(row, "instruction", path, n)
    extra = _text(row, "input", path, n, required=False)
    system = _text(row, "system", path, n, required=False)
    user = f"{instruction}\n\n{extra}" if extra.strip() else instruction
    messages = [{"role": "system", "content": system}] if system.strip() else []
    return [
        *messages,
        {"role": "user", "content": user},
        {"role": "assistant", "content": _text(row, "output", path, n)},
    ]


def _sharegpt(row: Any, path: Path, n: int) -> list[Message]:
    turns = row.get("conversations", row.get("messages")) if isinstance(row, dict) else None
    if not isinstance(turns, list) or not turns:
        raise InputError(f"{path} row {n}: expected conversations: [{{from, value}}] or messages: [{{role, content}}]")
    messages = []
    for turn in turns:
        if not isinstance(turn, dict):
            raise InputError(f"{path} row {n}: a turn is {str(turn)[:60]!r}, not an object")
        who = turn.get("from", turn.get("role"))
        role = SHAREGPT_ROLES.get(str(who))
        if role is None:
            raise InputError(f"{path} row {n}: role {who!r} is not one of {sorted(SHAREGPT_ROLES)}")
        messages.append({"role": role, "content": _text(turn, "value" if "value" in turn else "content", path, n)})
    if not any(m["role"] == "assistant" for m in messages):
        raise InputError(f"{path} row {n}: no assistant turn, so nothing to learn from; drop the row")
    return messages
