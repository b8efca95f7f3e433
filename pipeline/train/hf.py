"""A Hugging Face Transformers classifier as pipe trains it, with LoRA adapters through PEFT.

`model: {arch: hf, path: DIR}` names a `save_pretrained` directory (config.json, weights, tokenizer).
`TextClassifier` wraps its sequence classifier so it is called like every zoo model: inputs
positionally in manifest order, `forward(input_ids [B, T], attention_mask [B, T]) -> logits
[B, classes]`. The classes are the data's (`id2label` from its labels); a head of another size in
DIR is replaced by a new one.

With a `lora:` section the base weights are frozen and PEFT adds rank-r adapters to the named
modules; the classifier head trains whole (it is new). The module's state is then what trains
(adapters and head): checkpoints and `checkpoint/model.safetensors` hold that alone, a few MB,
and the base comes back from DIR, whose digest the train record keeps (`pipeline.data.text.base_digest`). Before
export the adapters are merged into the base weights (`merged`), so model.onnx is a plain
transformers graph that every later stage handles unchanged.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeline.core.errors import InputError
from pipeline.data import DataInfo
from pipeline.recipe.architectures import LoraSpec


class TextClassifier(nn.Module):
    """A transformers model called as pipe calls models: (input_ids, attention_mask) -> logits (a sequence
    classifier's [B, classes], or a causal LM's [B, T, vocab]: pipeline/train/causal_lm.py)."""

    def __init__(self, net: nn.Module, lora: bool) -> None:
        super().__init__()
        self.net = net
        self.lora = lora
        # With LoRA, the state is the trainable part only (adapters, head); the base comes from the directory.
        self._state_keys = {name for name, p in self.named_parameters() if p.requires_grad} if lora else None

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.net(input_ids=input_ids, attention_mask=attention_mask).logits  # [B, classes]

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        full = super().state_dict(*args, **kwargs)
        if self._state_keys is None:
            return full
        prefix = kwargs.get("prefix", "")
        return type(full)((k, v) for k, v in full.items() if k.removeprefix(prefix) in self._state_keys)

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:
        if self._state_keys is None:
            return super().load_state_dict(state_dict, strict=strict, assign=assign)
        # The module's frozen base keys may come too (FSDP's set_model_state_dict adds every rank's own
        # values of them); the trainable keys must all be there, and nothing the module lacks.
        given, known = set(state_dict), set(super().state_dict())
        if strict and (not self._state_keys <= given or not given <= known):
            missing, unexpected = sorted(self._state_keys - given), sorted(given - known)
            raise RuntimeError(
                f"the adapter state does not fit the model: missing {missing[:4]}, unexpected {unexpected[:4]}"
            )
        return super().load_state_dict(state_dict, strict=False, assign=assign)

    def parameter_counts(self) -> dict[str, int]:
        """Parameters that train, and all of them (the base's, the adapters', the head's)."""
        params = list(self.parameters())
        return {"trainable": sum(p.numel() for p in params if p.requires_grad), "total": sum(p.numel() for p in params)}

    def merged(self) -> TextClassifier:
        """The adapters merged into the base weights: a plain transformers model (itself without LoRA)."""
        if not self.lora:
            return self
        return TextClassifier(self.net.merge_and_unload(), lora=False)


def build_text_classifier(model_dir: Path, info: DataInfo, lora: LoraSpec | None) -> TextClassifier:
    """The classifier in `model_dir` with a head for the data's classes, LoRA adapters when `lora` is set."""
    if not (model_dir / "config.json").is_file():
        raise InputError(
            f"model.path {model_dir} is not a transformers model directory (no config.json); save the model with "
            "save_pretrained and point model.path at that directory"
        )
    require_hf("transformers")
    from transformers import AutoModelForSequenceClassification

    from pipeline.runtime.pretrained import is_head, load_pretrained

    labels = info.labels
    with transformers_quiet():
        net, missing = load_pretrained(
            AutoModelForSequenceClassification,
            model_dir,
            num_labels=len(labels),
            id2label=dict(enumerate(labels)),
            label2id={name: i for i, name in enumerate(labels)},
            ignore_mismatched_sizes=True,  # a head for other classes is replaced by a new one
            attn_implementation="eager",  # plain MatMul + Softmax: what every exporter and runtime takes
        )
    net.train()
    if lora is None:
        return TextClassifier(net, lora=False)
    if random := [k for k in missing if not is_head(k)]:  # LoRA freezes the base: these would stay random
        raise InputError(
            f"{model_dir}: {len(random)} base weight(s) are not in its checkpoint ({', '.join(random[:4])}), and "
            "lora: freezes the base, so they would stay random; pass a directory whose weights are complete"
        )
    return TextClassifier(_with_adapters(net, lora, model_dir), lora=True)


def _with_adapters(net: nn.Module, lora: LoraSpec, model_dir: Path) -> nn.Module:
    require_hf("peft")
    from peft import LoraConfig, TaskType, get_peft_model

    config = LoraConfig(
        task_type=TaskType.SEQ_CLS,  # the classifier head trains whole (modules_to_save)
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
    )
    linear = sorted({name.rsplit(".", 1)[-1] for name, m in net.named_modules() if isinstance(m, nn.Linear)})
    names = [name for name, _ in net.named_modules()]
    # PEFT's rule for a list: a module is targeted when its name is the entry or ends in "." + the entry
    unmatched = [t for t in lora.target_modules if not any(n == t or n.endswith(f".{t}") for n in names)]
    if unmatched:  # PEFT refuses only a list of which nothing matches; one typo beside a match trained silently
        raise InputError(
            f"lora.target_modules {unmatched} do not name modules of {model_dir}; its linear layers are named {linear}"
        )
    try:
        with warnings.catch_warnings():
            # peft 0.21 reads transformers' deprecated `is_gradient_checkpointing`; nothing pipe can change
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            return get_peft_model(net, config)
    except ValueError as exc:
        raise InputError(
            f"lora.target_modules {list(lora.target_modules)} do not name modules of {model_dir} ({_first(exc)}); "
            f"its linear layers are named {linear}"
        ) from None


def require_hf(package: str) -> None:
    """`model.arch: hf` needs the `hf` profile: without it, one line saying how to install it."""
    import importlib.util

    if importlib.util.find_spec(package) is None:
        raise InputError(
            f"model.arch hf needs {package}, which is not installed; install pipe's hf profile: pip install '.[hf]'"
        )


@contextlib.contextmanager
def transformers_quiet() -> Iterator[None]:
    """transformers reports loading (progress bars, 'newly initialized' head weights) at INFO and WARNING;
    the head is new on purpose, and pipe prints its own progress. Restored afterwards."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def _first(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]
