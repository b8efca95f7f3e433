"""A text-generation model's record (manifest `generation`): its KV cache layout and how it generates.

A causal language model is exported as one graph that takes its past keys and values as inputs and
gives the present ones back (docs/language-models.md). What a runtime needs to drive it, beside the
graph, is recorded here:

- `CacheLayout`: layers, key/value heads, head size and dtype, and the names of the past inputs and
  present outputs (`past_key_values.N.key|value`, `present.N.key|value`, as onnxruntime-genai and
  Optimum name them), so a server can allocate the cache and feed a zero-length past on the first step.
- `Generation`: the cache layout, the end-of-sequence ids, the id that pads a prompt on the left, the
  context length, the chat template (a file in the version, its sha256 here) and generation_config.json
  (a file in the version, its sampling defaults here). The whole record is part of the identity digest:
  another chat template or other EOS ids make another model.

`read_generation` reads these facts from a transformers directory (`config.json`, `generation_config.json`,
the tokenizer's chat template) with the standard library only: the manifest imports this module.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.artifact.checks import non_negative, one_of, positive, token_ids
from pipeline.core.errors import InputError

PAST = "past_key_values.{layer}.{kind}"  # input names, kind: key | value
PRESENT = "present.{layer}.{kind}"  # output names
KINDS = ("key", "value")
# optional inputs of a written decoder (inputs with a default; a runtime that does not know them is unaffected)
LOGITS_FROM = "logits_from"  # int64 scalar, default 0: the first column whose logits are computed; -1 the last
PRESENT_NEW_ONLY = "present_new_only"  # bool, default False: the presents hold the new tokens' keys and values only
# bool, default False: one token a row, each row's tokens from column 0 of pasts that are whole buffers, the
# presents those buffers with the new keys and values written after each row's last (bind them to the same memory)
DECODE_IN_PLACE = "decode_in_place"
CHAT_TEMPLATE_FILE = "tokenizer/chat_template.jinja"  # in the version, listed under files
GENERATION_CONFIG_FILE = "generation_config.json"  # in the version, listed under files
# generation_config.json keys kept as the model's sampling defaults (a server's, when a request says nothing)
DEFAULT_KEYS = ("max_new_tokens", "do_sample", "temperature", "top_p", "top_k", "repetition_penalty")
CACHE_DTYPES = ("float32", "float16", "bfloat16")


def _number_at_least(low: float, above: bool = False, high: float = float("inf")) -> Any:
    def problem(value: Any) -> str | None:
        fine = (isinstance(value, (int, float)) and not isinstance(value, bool)
                and (value > low if above else value >= low) and value <= high)  # fmt: skip
        most = f" and at most {high:g}" if high < float("inf") else ""
        return None if fine else f"a number {'above' if above else 'at least'} {low:g}{most}"

    return problem


def _whole_at_least(low: int) -> Any:
    def problem(value: Any) -> str | None:
        fine = isinstance(value, int) and not isinstance(value, bool) and value >= low
        return None if fine else f"a whole number at least {low}"

    return problem


# what each sampling default may hold (transformers' own bounds): a server reads them as they are
DEFAULT_CHECKS = {
    "max_new_tokens": _whole_at_least(1),
    "do_sample": lambda value: None if isinstance(value, bool) else "true or false",
    "temperature": _number_at_least(0),
    "top_p": _number_at_least(0, above=True, high=1),
    "top_k": _whole_at_least(0),
    "repetition_penalty": _number_at_least(0, above=True),
}


def defaults_problems(defaults: dict[str, Any]) -> list[str]:
    """The sampling defaults (generation_config.json's DEFAULT_KEYS) that hold what no generation can use."""
    return [f"{key} {value!r:.40} is not {expected}" for key, value in defaults.items()
            if key in DEFAULT_CHECKS and (expected := DEFAULT_CHECKS[key](value))]  # fmt: skip


def _windows_problem(windows: list[int] | None) -> str | None:
    if windows is None:
        return None
    if any(w < 0 for w in windows) or not any(windows):
        return f"expected each layer's window >= 0 and at least one above 0 (absent when none slides), got {windows}"
    return None


@dataclass(frozen=True)
class CacheLayout:
    """The KV cache of a decoder graph: one key and one value tensor per layer, [batch, kv_heads, length, head_size]."""

    layers: int = field(metadata={"check": positive})
    kv_heads: int = field(metadata={"check": positive})  # grouped-query attention: fewer than the query heads
    head_size: int = field(metadata={"check": positive})
    dtype: str = field(default="float32", metadata={"check": one_of(CACHE_DTYPES)})
    past: str = PAST  # input name pattern ({layer}, {kind})
    present: str = PRESENT  # output name pattern
    # Each layer's sliding window in positions, 0 where a layer attends to its whole past; absent when no layer
    # slides. The window is the graph's attention mask's: every layer's cache holds its whole past all the same.
    windows: list[int] | None = field(default=None, metadata={"omit_none": True, "check": _windows_problem})

    def past_names(self) -> list[str]:
        """The past inputs in graph order: layer 0 key, layer 0 value, layer 1 key, ..."""
        return [self.past.format(layer=i, kind=k) for i in range(self.layers) for k in KINDS]

    def present_names(self) -> list[str]:
        """The present outputs in graph order, each the past input of the same place one step later."""
        return [self.present.format(layer=i, kind=k) for i in range(self.layers) for k in KINDS]

    def smallest_window(self) -> int | None:
        """The narrowest sliding window of any layer (None: no layer slides)."""
        return min((w for w in self.windows or [] if w), default=None)

    def windows_said(self) -> str:
        """The sliding windows in words ("" when no layer slides): `sliding windows of 512 on 5 of 6 layers`."""
        if not self.windows:
            return ""
        sizes = ", ".join(str(w) for w in sorted({w for w in self.windows if w}))
        return f"sliding windows of {sizes} on {sum(1 for w in self.windows if w)} of {self.layers} layers"

    def bytes_per_token(self) -> int:
        """Cache bytes one token of one row takes (keys and values of every layer)."""
        width = 4 if self.dtype == "float32" else 2
        return 2 * self.layers * self.kv_heads * self.head_size * width


@dataclass(frozen=True)
class Generation:
    """How a text-generation model generates (manifest `generation`, task `text-generation` only)."""

    cache: CacheLayout
    # generation stops at any of these (generation_config.json, else config.json)
    eos_token_ids: list[int] = field(metadata={"check": token_ids})
    # fills a prompt's left padding (the pad token, else the first EOS id, as transformers does)
    padding_id: int = field(metadata={"check": non_negative})
    bos_token_id: int | None = field(default=None, metadata={"check": non_negative})
    # max_position_embeddings: prompt plus generated tokens
    context_length: int | None = field(default=None, metadata={"check": positive})
    chat_template: str | None = None  # CHAT_TEMPLATE_FILE when the tokenizer has one
    chat_template_sha256: str | None = None  # its sha256: in the identity digest
    generation_config: str | None = None  # GENERATION_CONFIG_FILE when the source has one
    defaults: dict[str, Any] = field(default_factory=dict)  # its sampling defaults (DEFAULT_KEYS)


@dataclass(frozen=True)
class GenerationSource:
    """What a transformers directory says of generation, before the graph is known."""

    eos_token_ids: list[int]
    bos_token_id: int | None
    padding_id: int | None
    context_length: int | None
    chat_template: str | None  # the template's text
    generation_config: Path | None  # the file, copied into the version
    defaults: dict[str, Any]


def read_generation(model_dir: Path, tokenizer_dir: Path | None = None) -> GenerationSource:
    """The EOS/BOS/pad ids, context length, chat template and sampling defaults of a transformers directory
    (`config.json`, `generation_config.json`, `chat_template.jinja` or tokenizer_config.json's `chat_template`)."""
    model_dir = Path(model_dir)
    tokenizer_dir = Path(tokenizer_dir or model_dir)
    config = _object(model_dir / "config.json")
    config = {**config, **config.get("text_config", {})} if isinstance(config.get("text_config"), dict) else config
    gen_path = model_dir / GENERATION_CONFIG_FILE
    for copied in (gen_path, tokenizer_dir / "chat_template.jinja"):  # their bytes go into the version
        _refuse_outside_link(copied, copied.parent)
    gen = _object(gen_path)
    eos = _ids(gen.get("eos_token_id", config.get("eos_token_id")), "eos_token_id", gen_path)
    if not eos:
        raise InputError(
            f"{model_dir} names no end-of-sequence token (eos_token_id in generation_config.json or config.json): "
            "generation could not stop; set eos_token_id in config.json"
        )
    bos = _ids(gen.get("bos_token_id", config.get("bos_token_id")), "bos_token_id", gen_path)
    pad = _ids(gen.get("pad_token_id", config.get("pad_token_id")), "pad_token_id", gen_path)
    context = config.get("max_position_embeddings") or config.get("n_positions")
    defaults = {k: gen[k] for k in DEFAULT_KEYS if k in gen and gen[k] is not None}
    if problems := defaults_problems(defaults):
        raise InputError(f"{gen_path}: {'; '.join(problems)}; fix generation_config.json or remove the key")
    template_file = tokenizer_dir / "chat_template.jinja"
    if template_file.is_file():
        template: str | None = template_file.read_text(encoding="utf-8")
    else:
        found = _object(tokenizer_dir / "tokenizer_config.json").get("chat_template")
        template = found if isinstance(found, str) and found else None
    if template is not None and (problem := template_syntax_problem(template)):
        raise InputError(f"{tokenizer_dir}: the chat template does not compile: {problem}; fix chat_template.jinja")
    return GenerationSource(
        eos_token_ids=eos,
        bos_token_id=bos[0] if bos else None,
        padding_id=pad[0] if pad else None,
        context_length=int(context) if isinstance(context, int) and context > 0 else None,
        chat_template=template,
        generation_config=gen_path if gen_path.is_file() else None,
        defaults=defaults,
    )


def template_syntax_problem(text: str) -> str | None:
    """Why jinja2 cannot compile the chat template (None: it compiles), as pipe serve compiles it: in the
    sandbox, trim_blocks and lstrip_blocks (serve/generation/chat.py). jinja2 is imported here only."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    try:
        ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).parse(text)
    except jinja2.TemplateSyntaxError as exc:
        return f"line {exc.lineno}: {exc.message}"
    return None


def _refuse_outside_link(path: Path, directory: Path) -> None:
    """A link that leads out of the model's directory (chat_template.jinja -> /etc/passwd) is refused: its
    target would be copied into the version and read by every chat."""
    if path.is_symlink() and directory.resolve() not in path.resolve().parents:
        raise InputError(
            f"{path} is a link to {path.resolve()}, outside {directory}; copy the file into the directory instead"
        )


def template_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def generation_record(
    cache: CacheLayout, source: GenerationSource, padding_id: int
) -> tuple[Generation, dict[str, bytes]]:
    """The manifest's `generation` for a graph with `cache`, and the files it names (version-relative path ->
    bytes: the chat template, generation_config.json), which the caller writes and lists."""
    files: dict[str, bytes] = {}
    if source.chat_template is not None:
        files[CHAT_TEMPLATE_FILE] = source.chat_template.encode("utf-8")
    if source.generation_config is not None:
        files[GENERATION_CONFIG_FILE] = source.generation_config.read_bytes()
    record = Generation(
        cache=cache,
        eos_token_ids=source.eos_token_ids,
        padding_id=padding_id,
        bos_token_id=source.bos_token_id,
        context_length=source.context_length,
        chat_template=CHAT_TEMPLATE_FILE if source.chat_template is not None else None,
        chat_template_sha256=template_sha256(source.chat_template) if source.chat_template is not None else None,
        generation_config=GENERATION_CONFIG_FILE if source.generation_config is not None else None,
        defaults=source.defaults,
    )
    return record, files


def generation_problems(
    record: Generation | None,
    task: str,
    input_names: list[str],
    output_names: list[str],
    files: dict[str, Any],
    vocab_size: int | None = None,
) -> list[str]:
    """What a manifest's generation record says against the rest: a record without the task (or the task
    without one), a cache tensor the graph lacks, a file not listed, a token id past the vocabulary of the
    token ids input (`vocab_size`, when it records one)."""
    if task == "text-generation" and record is None:
        return ["generation: missing; a text-generation model records its cache layout and EOS ids"]
    if record is None:
        return []
    if task != "text-generation":
        return [f"generation: recorded for task {task!r}; it belongs to task 'text-generation' alone"]
    problems = []
    if record.cache.windows is not None and len(record.cache.windows) != record.cache.layers:
        problems.append(
            f"generation.cache.windows: {len(record.cache.windows)} windows for {record.cache.layers} layers"
        )
    if missing := [n for n in record.cache.past_names() if n not in input_names]:
        problems.append(f"generation.cache: past inputs {missing[:2]} are not inputs of the model")
    if missing := [n for n in record.cache.present_names() if n not in output_names]:
        problems.append(f"generation.cache: present outputs {missing[:2]} are not outputs of the model")
    if not record.eos_token_ids:
        problems.append("generation.eos_token_ids: empty; generation could not stop")
    if vocab_size is not None:
        ids = {"eos_token_ids": record.eos_token_ids, "padding_id": [record.padding_id],
               "bos_token_id": [] if record.bos_token_id is None else [record.bos_token_id]}  # fmt: skip
        for key, values in ids.items():
            if outside := [v for v in values if v >= vocab_size]:
                problems.append(f"generation.{key}: {outside[:3]} past the vocabulary (ids 0..{vocab_size - 1})")
    for key, rel in (("chat_template", record.chat_template), ("generation_config", record.generation_config)):
        if rel is not None and rel not in files:
            problems.append(f"generation.{key}: {rel!r} is not listed in files, so it cannot be verified")
    listed = files.get(record.chat_template) if record.chat_template is not None else None
    if listed is not None and record.chat_template_sha256 is not None and listed.sha256 != record.chat_template_sha256:
        problems.append(
            f"generation.chat_template_sha256: {record.chat_template_sha256[:12]}... is not the sha256 of "
            f"{record.chat_template} ({listed.sha256[:12]}...): the template was changed after import; re-import"
        )
    problems += [f"generation.defaults: {problem}" for problem in defaults_problems(record.defaults)]
    if (record.chat_template is None) != (record.chat_template_sha256 is None):
        problems.append("generation.chat_template_sha256: given with no chat_template, or missing for one")
    return problems


def _ids(value: Any, key: str, where: Path) -> list[int]:
    """A token id or a list of them as a list; [] for none."""
    if value is None:
        return []
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise InputError(f"{where.parent}: {key} {value!r} is not a token id or a list of them")
    return list(values)


def _object(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{path} is not JSON: {str(exc)[:200]}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data
