"""What a trained causal LM's version holds beside its weights: the decoder's specs, its generation record,
its tokenizer (padded on the left, as prompts are) and chat template, and the golden first step.

The manifest states the graph `pipe export` will make (pipeline/export/causal_lm.py): `input_ids`,
`attention_mask`, `position_ids` and the past keys and values in; the logits and the present keys and
values out, the cache layout read from the trained model itself (pipeline/runtime/decoder.py). golden.npz
holds the first step over the first test rows, re-padded on the left with a zero-length past, and the
trained model's outputs for it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from pipeline.artifact.generation import Generation, generation_record, read_generation
from pipeline.artifact.golden import Golden
from pipeline.artifact.tensors import TensorSpec
from pipeline.artifact.tokens import TokenizerRecord, TokenLimits, read_tokenizer, write_tokenizer
from pipeline.data import Splits
from pipeline.data.splits import TEXT_IDS, TEXT_MASK
from pipeline.runtime.decoder import CachedDecoder, cache_layout
from pipeline.runtime.generate import decoder_specs, first_step
from pipeline.runtime.runners import torch_runner

GOLDEN_ROWS = 16  # test rows whose first step golden.npz keeps


@dataclass
class LanguageModelParts:
    """The manifest fields and files of a trained causal LM's version."""

    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    generation: Generation
    tokenizer: TokenizerRecord
    files: dict[str, bytes]  # version-relative path -> bytes (the chat template, generation_config.json)
    tokenizer_files: list[str]  # written into the version by write_tokenizer
    golden: Golden


def language_model_parts(root: Path, model: torch.nn.Module, splits: Splits, model_dir: Path) -> LanguageModelParts:
    """The parts for `model` (the trained TextClassifier, merged, fp32, eval) trained from `model_dir`."""
    info = splits.info
    net = model.net  # the transformers causal LM itself
    decoder = CachedDecoder(net).eval()
    layout = cache_layout(decoder)
    source = read_generation(model_dir)
    padding = info.padding_id if info.padding_id is not None else source.eos_token_ids[0]
    limits = TokenLimits(
        names={"ids": TEXT_IDS, "mask": TEXT_MASK},
        vocab_size=info.num_classes,
        padding_id=padding,
        max_length=source.context_length or info.max_length,
    )
    inputs, outputs = decoder_specs(limits, layout, info.num_classes)
    generation, files = generation_record(layout, source, padding)
    record, written = write_tokenizer(root, read_tokenizer(model_dir))
    first = first_step(*_left_padded(splits.test.inputs, padding), layout)
    with torch.no_grad():
        reference = torch_runner(decoder, inputs, outputs)(first)
    return LanguageModelParts(
        inputs=inputs,
        outputs=outputs,
        generation=generation,
        tokenizer=replace(record, padding_side="left"),  # a prompt batch is padded on the left
        files=files,
        tokenizer_files=written,
        golden=Golden(first, reference),
    )


def _left_padded(inputs: dict[str, np.ndarray], padding: int) -> tuple[np.ndarray, np.ndarray]:
    """The first GOLDEN_ROWS test rows (right-padded for training) padded on the left instead, as prompts are."""
    ids, mask = inputs[TEXT_IDS][:GOLDEN_ROWS], inputs[TEXT_MASK][:GOLDEN_ROWS]
    out_ids, out_mask = np.full_like(ids, padding), np.zeros_like(mask)
    for i, (row, keep) in enumerate(zip(ids, mask, strict=True)):
        real = row[keep == 1]
        out_ids[i, len(row) - len(real) :], out_mask[i, len(row) - len(real) :] = real, 1
    return out_ids, out_mask
