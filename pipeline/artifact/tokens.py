"""Token models: what each token input accepts, and the tokenizer a text model carries in its version.

Three things, one concept (a model fed token sequences):

- `TokenInput`, on each integer input of a token model (`inputs[].tokens`), is part of the tensor
  spec (pipeline/artifact/tensors.py): its `role` (`ids`, the token ids; `mask`, the attention
  mask; `type_ids`, the token types), the values it holds (`0 .. vocab_size - 1`: the vocabulary,
  the token-type count, 2 for a mask), the longest sequence and the value that pads a short row. A
  server checks ids against it and pads ragged rows with it.
- `TokenizerRecord`, on the manifest (`tokenizer`): where the tokenizer is in the version
  (`tokenizer/tokenizer.json`, the `tokenizers` library's one-file format, and the source's
  `tokenizer_config.json`, both listed under `files` and hashed like every file) and how texts are
  cut and padded. A model with one takes text (`pipe serve`, `pipe predict --text`).
- `TokenLimits`: one model's limits as one value (input names by role, vocabulary size, padding id,
  max length, token-type count), made from a tokenizer and a transformers `config.json` or from the
  command line, applied to the specs and read back from them.

`read_tokenizer` reads a transformers directory's tokenizer once, keeping its files' bytes
(`tokenizers` imported inside: no torch, no transformers); `write_tokenizer` writes those bytes into a
version directory and gives its record and the files to list: what is written is what was read and
used, even if the directory's files change in between (a LoRA run tokenizes at its start and writes
the tokenizer at its end). The standard library at import time: the manifest imports this module.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from pipeline.artifact.tensors import ROLES, Role, TensorSpec, TokenInput
from pipeline.core.errors import InputError

Side = Literal["right", "left"]
TOKENIZER_DIR = "tokenizer"
TOKENIZER_FILE = "tokenizer/tokenizer.json"  # the tokenizers library's format: Tokenizer.from_file reads it
TOKENIZER_CONFIG = "tokenizer/tokenizer_config.json"  # transformers' settings for it, as the source had them
SOURCE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")  # copied when present
SANE_MAX_LENGTH = 1_000_000  # transformers writes model_max_length 1e30 for "no limit"
# Input names transformers' exporters and tf2onnx give each role, matched lowercased.
ROLE_WORDS: dict[Role, tuple[str, ...]] = {
    "mask": ("attention_mask", "input_mask", "mask"),
    "type_ids": ("token_type_ids", "segment_ids", "type_ids", "token_type"),
    "ids": ("input_ids", "ids", "tokens", "input_word_ids"),
}


@dataclass(frozen=True)
class TokenizerRecord:
    """The tokenizer a text model carries (manifest `tokenizer`): texts in, token ids out, as trained."""

    file: str = TOKENIZER_FILE  # tokenizer.json in the version, listed under files
    config: str | None = TOKENIZER_CONFIG  # tokenizer_config.json in the version, listed under files; None: none
    truncation_side: Side = "right"  # a text past the ids input's max_length loses its tokens on this side
    padding_side: Side = "right"  # a short row is padded on this side


@dataclass(frozen=True)
class TokenLimits:
    """One token model's limits: the names of its inputs by role and what they accept."""

    names: dict[str, str]  # role -> input name; `ids` always, `mask` and `type_ids` when the model takes them
    vocab_size: int  # rows of the word embedding: ids are 0 .. vocab_size - 1
    padding_id: int | None = None  # the id that pads a short row (None: not known)
    max_length: int | None = None  # the longest sequence (the position embedding; None: any)
    type_count: int | None = None  # token types (BERT's type_vocab_size); None without a type_ids input

    def inputs(self) -> dict[str, TokenInput]:
        """Input name -> its `TokenInput`."""
        made = {self.names["ids"]: TokenInput(self.vocab_size, self.max_length, self.padding_id, "ids")}
        if "mask" in self.names:
            made[self.names["mask"]] = TokenInput(2, self.max_length, 0, "mask")
        if "type_ids" in self.names:
            made[self.names["type_ids"]] = TokenInput(self.type_count or 1, self.max_length, 0, "type_ids")
        return made

    def apply(self, specs: list[TensorSpec]) -> list[TensorSpec]:
        """`specs` with each named input's `tokens` set (layout NT); refuses a name the specs lack."""
        made = self.inputs()
        if missing := sorted(set(made) - {s.name for s in specs}):
            raise InputError(f"token inputs {missing} are not inputs of the model ({[s.name for s in specs]})")
        for spec in specs:
            if spec.name in made and not spec.dtype.startswith(("int", "uint")):
                raise InputError(f"input {spec.name!r} is {spec.dtype}: token inputs hold integers")
        return [replace(s, tokens=made[s.name], layout="NT") if s.name in made else s for s in specs]

    @classmethod
    def read(cls, specs: list[TensorSpec]) -> TokenLimits | None:
        """The limits recorded on `specs`, or None when no input holds token ids."""
        by_role = {s.tokens.role: (s.name, s.tokens) for s in specs if s.tokens is not None}
        if "ids" not in by_role:
            return None
        ids = by_role["ids"][1]
        types = by_role.get("type_ids")
        return cls(
            names={role: by_role[role][0] for role in ROLES if role in by_role},
            vocab_size=ids.vocab_size,
            padding_id=ids.padding_id,
            max_length=ids.max_length,
            type_count=types[1].vocab_size if types else None,
        )


def limits_reading(limits: TokenLimits) -> dict[str, Any]:
    """The limits as `stages.import.read.tokens` records them (and `pipe info` shows them)."""
    return {
        "vocab_size": limits.vocab_size,
        "padding_id": limits.padding_id,
        "max_length": limits.max_length,
        "type_count": limits.type_count,
        "inputs": dict(limits.names),
    }


def guess_roles(names: list[str]) -> dict[str, str]:
    """Role -> input name, from the names exporters give (`input_ids`, `attention_mask`, `token_type_ids`);
    a lone input no word matches is the ids. Empty when no input is recognisably the ids."""
    roles: dict[str, str] = {}
    for role, words in ROLE_WORDS.items():
        for name in names:
            if name not in roles.values() and any(w == name.lower() or w in name.lower() for w in words):
                roles[role] = name
                break
    rest = [n for n in names if n not in roles.values()]
    if "ids" not in roles and len(rest) == 1:
        roles["ids"] = rest[0]
    return roles if "ids" in roles else {}


@dataclass(frozen=True)
class TokenizerSource:
    """A tokenizer read from a transformers directory: its files and what they say of the limits."""

    directory: Path
    files: tuple[str, ...]  # which of SOURCE_FILES it holds (tokenizer.json always)
    vocab_size: int  # its largest id + 1, added tokens included: every id it can make is below it
    padding_id: int | None  # its pad token's id
    max_length: int | None  # its model_max_length, when it states a real one
    truncation_side: Side
    padding_side: Side
    # each file's bytes as read: what tokenizes (`tokenizer()`) and what `write_tokenizer` writes
    contents: dict[str, bytes] = field(default_factory=dict, repr=False, compare=False)

    def tokenizer(self) -> Any:
        """A `tokenizers.Tokenizer` made from the bytes read, not from the directory as it is now."""
        from tokenizers import Tokenizer

        return Tokenizer.from_str(self.contents["tokenizer.json"].decode("utf-8"))


def read_tokenizer(directory: Path) -> TokenizerSource:
    """The fast tokenizer saved in `directory` (`tokenizer.json`, as `save_pretrained` writes it), read with
    the `tokenizers` library; InputError naming what is missing or unreadable."""
    from tokenizers import Tokenizer

    directory = Path(directory)
    path = directory / "tokenizer.json"
    if not path.is_file():
        raise InputError(
            f"{directory} holds no tokenizer.json: pipe reads fast tokenizers (save the tokenizer with "
            "save_pretrained from a transformers fast tokenizer, or pass the directory that holds tokenizer.json)"
        )
    contents = {name: (directory / name).read_bytes() for name in SOURCE_FILES if (directory / name).is_file()}
    try:
        tokenizer = Tokenizer.from_str(contents["tokenizer.json"].decode("utf-8"))
    except Exception as exc:  # the tokenizers library raises a bare Exception for a bad file
        raise InputError(f"{path} is not a tokenizers file: {str(exc).splitlines()[0][:200]}") from None
    config = _json_object(directory / "tokenizer_config.json", contents.get("tokenizer_config.json"))
    pad = config.get("pad_token")
    pad = pad.get("content") if isinstance(pad, dict) else pad
    padding_id = tokenizer.token_to_id(pad) if isinstance(pad, str) else None
    if padding_id is None and tokenizer.padding is not None:
        padding_id = tokenizer.padding.get("pad_id")
    max_length = config.get("model_max_length")
    if not (isinstance(max_length, int | float) and 1 <= max_length < SANE_MAX_LENGTH):
        max_length = (tokenizer.truncation or {}).get("max_length")
    specials = tokenizer.post_processor.num_special_tokens_to_add(False) if tokenizer.post_processor else 0
    if max_length and max_length <= specials:  # truncation would leave no room for a single token of text
        raise InputError(
            f"{directory}: model_max_length {max_length} leaves no room for text: the tokenizer adds {specials} "
            f"special token(s) to every text, so every text would be refused; set model_max_length in "
            f"tokenizer_config.json above {specials} (the model's max_position_embeddings, usually)"
        )
    sides = {key: config.get(key, "right") for key in ("truncation_side", "padding_side")}
    if bad := {k: v for k, v in sides.items() if v not in ("right", "left")}:
        raise InputError(f"{directory / 'tokenizer_config.json'}: {bad} must be 'right' or 'left'")
    return TokenizerSource(
        directory=directory,
        files=tuple(contents),
        vocab_size=_id_count(tokenizer),
        padding_id=padding_id,
        max_length=int(max_length) if max_length else None,
        truncation_side=sides["truncation_side"],
        padding_side=sides["padding_side"],
        contents=contents,
    )


def _id_count(tokenizer: Any) -> int:
    """The largest id the tokenizer can make, plus one: a vocabulary of 100 entries may hold id 5,000, and
    counting the entries would let ids past an embedding table through."""
    ids = tokenizer.get_vocab(with_added_tokens=True).values()
    return max(max(ids, default=-1) + 1, tokenizer.get_vocab_size(with_added_tokens=True))


def hf_limits(model_dir: Path, input_names: list[str], tokenizer: TokenizerSource | None) -> TokenLimits:
    """The limits of a transformers model exported with `input_names`, from its `config.json` (vocab_size,
    type_vocab_size, max_position_embeddings, pad_token_id) and its tokenizer (model_max_length, pad token)."""
    config = _json_object(Path(model_dir) / "config.json")
    roles = guess_roles(input_names)
    if not roles:
        raise InputError(f"none of the inputs {input_names} holds token ids (input_ids)")
    vocab = config.get("vocab_size") or (tokenizer.vocab_size if tokenizer else None)
    if not isinstance(vocab, int) or vocab < 1:
        raise InputError(f"{model_dir}/config.json states no vocab_size")
    if tokenizer is not None and tokenizer.vocab_size > vocab:
        raise InputError(
            f"{tokenizer.directory}: the tokenizer makes {tokenizer.vocab_size} ids but the model embeds {vocab} "
            "(config.json vocab_size): they are not a pair; pass the tokenizer the model was trained with"
        )
    lengths = [n for n in (config.get("max_position_embeddings"), tokenizer and tokenizer.max_length) if n]
    pad = config.get("pad_token_id")
    padding_id = tokenizer.padding_id if tokenizer is not None and tokenizer.padding_id is not None else pad
    return TokenLimits(
        names=roles,
        vocab_size=vocab,
        padding_id=padding_id if isinstance(padding_id, int) and 0 <= padding_id < vocab else None,
        max_length=int(min(lengths)) if lengths else None,
        type_count=int(config.get("type_vocab_size") or 1) if "type_ids" in roles else None,
    )


def write_tokenizer(version: Path, source: TokenizerSource) -> tuple[TokenizerRecord, list[str]]:
    """Write `source`'s files, as they were read, into `version/tokenizer/`; the record for the manifest's
    `tokenizer` and the files written (relative to `version`), which the caller lists under `files`."""
    target = Path(version) / TOKENIZER_DIR
    target.mkdir(parents=True, exist_ok=True)
    for name in source.files:
        (target / name).write_bytes(source.contents[name])
    record = TokenizerRecord(
        file=TOKENIZER_FILE,
        config=TOKENIZER_CONFIG if "tokenizer_config.json" in source.files else None,
        truncation_side=source.truncation_side,
        padding_side=source.padding_side,
    )
    return record, [f"{TOKENIZER_DIR}/{name}" for name in source.files]


def tokenizer_problems(record: TokenizerRecord | None, specs: list[TensorSpec], files: dict[str, Any]) -> list[str]:
    """What a manifest's tokenizer record says against the rest: its files unlisted, no ids input to feed."""
    problems = []
    for i, spec in enumerate(specs):
        tokens = spec.tokens
        if tokens is None:
            continue
        if tokens.padding_id is not None and not 0 <= tokens.padding_id < tokens.vocab_size:
            problems.append(
                f"inputs[{i}].tokens.padding_id: {tokens.padding_id} is not an id in [0, {tokens.vocab_size})"
            )
    roles = [s.tokens.role for s in specs if s.tokens is not None]
    if repeated := sorted({r for r in roles if roles.count(r) > 1}):
        problems.append(f"inputs[].tokens.role: {repeated} given to more than one input; each role names one input")
    if record is None:
        return problems
    for key, rel in (("file", record.file), ("config", record.config)):
        if rel is not None and rel not in files:
            problems.append(f"tokenizer.{key}: {rel!r} is not listed in files, so it cannot be verified")
    if "ids" not in roles:
        problems.append("tokenizer: recorded, but no input has tokens.role 'ids' for the ids it makes")
    return problems


def _json_object(path: Path, content: bytes | None = None) -> dict[str, Any]:
    """A JSON object file (or `content`, its bytes as read before), {} when absent; InputError when it is not one."""
    if content is None and not path.is_file():
        return {}
    try:
        data = json.loads((content if content is not None else path.read_bytes()).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InputError(f"{path} is not JSON: {str(exc)[:200]}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data
