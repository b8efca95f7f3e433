"""A transformers model loaded from a local directory, with what its weights left random said out loud.

    model, random = load_pretrained(AutoModel, Path("my-bert"))   # InputError for a directory that cannot be it

`pipe import DIR` (export) and `model.arch: hf` training (train) both load a `save_pretrained`
directory; this is the one place that does it, below both stages. transformers raises a different
exception for each way a directory is broken, and loads weights that do not fit the architecture
as random with no error (a `gpt2` model_type over BERT weights: every weight missing). Here:

- a broken directory is one `InputError` naming it: a config.json that does not fit the weights
  (the tensors whose shapes differ), weights that are a pickle holding more than tensors (torch's
  `weights_only` refuses it), a truncated or corrupt `model.safetensors` or `pytorch_model.bin`;
- weights of which nothing fits the model (no tensor of the checkpoint loaded) are refused: the
  model would be random;
- otherwise the weights the checkpoint lacked, which start random, are returned by name (a base
  model loaded as a classifier: its new head), for the caller to say where the user reads.

torch and transformers are imported by the caller's `auto` class; this module imports neither.
"""

from __future__ import annotations

import hashlib
import pickle
import warnings
import zipfile
from pathlib import Path
from typing import Any

from pipeline.core.errors import InputError, first_line

# The classification heads transformers adds on top of a base model (PEFT's modules_to_save for SEQ_CLS too).
HEAD_MODULES = ("classifier", "pre_classifier", "score")


def is_head(key: str) -> bool:
    """True for a weight of the classification head (`classifier.weight`, `score.weight`, ...)."""
    return key.split(".", 1)[0] in HEAD_MODULES


def load_pretrained(auto: Any, source: Path, **options: Any) -> tuple[Any, list[str]]:
    """`auto.from_pretrained(source, **options)` and the names of the weights that start random.

    Shapes that differ from the checkpoint's are loaded as random by transformers with
    `ignore_mismatched_sizes` (a new head for other classes); outside the head they mean config.json does
    not fit the weights, and are refused.
    """
    options.setdefault("ignore_mismatched_sizes", True)  # pipe names the tensors that differ, below
    try:
        with warnings.catch_warnings():  # torch warns of a pickle's protocol before refusing it; pipe says why
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            model, info = auto.from_pretrained(str(source), output_loading_info=True, **options)
    except pickle.UnpicklingError as exc:
        raise InputError(
            f"{source}: the weights are a pickle holding more than tensors, which pipe does not load "
            f"({first_line(exc, 120)}); save the model with save_pretrained (model.safetensors)"
        ) from None
    except (zipfile.BadZipFile, EOFError) as exc:
        raise InputError(
            f"{source}: pytorch_model.bin is truncated or corrupt ({first_line(exc, 120)}); save the model again"
        ) from None
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise InputError(f"transformers cannot load {source} as {auto.__name__}: {_why(exc)}") from None
    except Exception as exc:  # safetensors' SafetensorError derives from Exception alone
        if type(exc).__name__ != "SafetensorError":
            raise
        raise InputError(
            f"{source}: model.safetensors is truncated or corrupt ({first_line(exc, 160)}); save the model again"
        ) from None
    keys = list(model.state_dict())
    mismatched = [m for m in info.get("mismatched_keys", []) if not is_head(m[0])]
    if mismatched:
        shown = "; ".join(f"{k}: {list(a)} in the weights, {list(b)} by config.json" for k, a, b in mismatched[:3])
        raise InputError(
            f"{source}/config.json does not fit its weights: {len(mismatched)} tensor(s) differ in shape ({shown}); "
            "pass the config.json saved with these weights"
        )
    missing = sorted(set(info.get("missing_keys", [])) | {m[0] for m in info.get("mismatched_keys", [])})
    if keys and len(set(missing) & set(keys)) == len(keys):
        unexpected = list(info.get("unexpected_keys", []))
        raise InputError(
            f"{source}: none of the {len(keys)} weights of {type(model).__name__} (model_type "
            f"{getattr(model.config, 'model_type', '?')!r}) is in the checkpoint, which holds {unexpected[:3]}...: "
            "config.json names another architecture than the weights; pass the config.json saved with them"
        )
    return model, missing


def random_note(missing: list[str], total: int) -> str:
    """One line saying which weights start random (for the import record's notes and the command's output)."""
    shown = ", ".join(missing[:6]) + (f" ... ({len(missing)} in all)" if len(missing) > 6 else "")
    head = all(is_head(k) for k in missing)
    why = (
        "the directory holds no classification head, so the logits of this import mean nothing until it is "
        "fine-tuned (pipe train --from, or a transformers classifier)"
        if head
        else "the checkpoint lacks them; outputs that depend on them are not the saved model's"
    )
    return f"{len(missing)} of {total} weights are not in the checkpoint and start random ({shown}): {why}"


def _why(exc: BaseException) -> str:
    """transformers' own message, minus its pointer to a report pipe does not print."""
    return first_line(exc, 300).replace("For details look at the above report!", "").strip()


def source_digest(source: Path) -> str:
    """sha256 over the directory's config, weights and tokenizer files (names and bytes, in order):
    what `pipe import DIR` records as the source's digest, and `pipe benchmark` checks before it times the
    directory's weights as the torch row."""
    digest = hashlib.sha256()
    for path in sorted(p for p in source.iterdir() if p.is_file()):
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as f:
            for block in iter(lambda f=f: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()
