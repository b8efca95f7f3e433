"""A decoder with its KV cache (pipeline/runtime/decoder.py) to one ONNX graph, and transformers' greedy reference.

Imported by the causal LM import and export only (it imports torch and transformers at the top).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch

from pipeline.artifact.generation import CacheLayout
from pipeline.export.fused_decoder import refusal, write_decoder
from pipeline.export.grouped_attention import grouped_while
from pipeline.export.onnx_export import (
    ExportResult,
    _torch_onnx_logs_quiet,
    check_requested_opset,
    needs_external_data,
)
from pipeline.runtime.decoder import CachedDecoder
from pipeline.runtime.generate import Generated, ended

# Example sizes the graph is traced at: none may be 0 or 1, which torch.export would specialize on.
TRACE_BATCH, TRACE_SEQUENCE, TRACE_PAST = 2, 4, 3


def export_decoder(
    decoder: CachedDecoder, layout: CacheLayout, path: Path, opset: int, grouped: bool = True, fused: bool = True
) -> ExportResult:
    """The decoder to one ONNX graph with dynamic batch, sequence, past and total lengths: written from the weights
    with onnxruntime's fused kernels where the family allows it (fused_decoder.py, exporter `fused`), else traced
    by the dynamo exporter, its grouped-query attention without repeating the cache per query head
    (grouped_attention.py). `fused` False and `grouped` False are for the benches comparing them."""
    if fused and refusal(decoder.model) is None:
        external = write_decoder(decoder.model, layout, path, opset)
        return ExportResult(exporter="fused", opset=opset, external_data=external)
    vocab_rows = int(decoder.model.get_input_embeddings().weight.shape[0])
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab_rows, (TRACE_BATCH, TRACE_SEQUENCE), generator=gen)
    mask = torch.ones((TRACE_BATCH, TRACE_PAST + TRACE_SEQUENCE), dtype=torch.int64)
    pos = torch.arange(TRACE_PAST, TRACE_PAST + TRACE_SEQUENCE).expand(TRACE_BATCH, -1).contiguous()
    past_shape = (TRACE_BATCH, layout.kv_heads, TRACE_PAST, layout.head_size)
    past = tuple(torch.randn(past_shape, generator=gen) for _ in layout.past_names())
    tokens = {0: "batch", 1: "sequence"}
    shapes = (tokens, {0: "batch", 1: "total_sequence"}, tokens, tuple({0: "batch", 2: "past_sequence"} for _ in past))
    external = needs_external_data(decoder)
    with warnings.catch_warnings(), _torch_onnx_logs_quiet(), torch.no_grad(), grouped_while(decoder.model, grouped):
        warnings.simplefilter("ignore")  # the exporter's own deprecation notes: nothing pipe can change
        program = torch.onnx.export(
            decoder.eval(),
            (ids, mask, pos, *past),
            input_names=["input_ids", "attention_mask", "position_ids", *layout.past_names()],
            output_names=["logits", *layout.present_names()],
            opset_version=opset,
            dynamo=True,
            dynamic_shapes=shapes,
            external_data=external,
            optimize=True,
            verbose=False,
        )
        program.save(str(path), external_data=external)
    _name_total_dims(path, layout)
    import onnx

    check_requested_opset(onnx.load(str(path), load_external_data=False), opset)
    return ExportResult(exporter="dynamo", opset=opset, external_data=external)


def _name_total_dims(path: Path, layout: CacheLayout) -> None:
    """The exporter names a present's length `past_sequence + sequence`; the graph says `total_sequence`,
    as the manifest and the attention mask do."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    presents = set(layout.present_names())
    for output in model.graph.output:
        if output.name in presents:
            output.type.tensor_type.shape.dim[2].dim_param = "total_sequence"
    onnx.save(model, str(path))  # the weights stay where they are: only the graph is rewritten


def reference_greedy(
    model: torch.nn.Module,
    input_ids: np.ndarray,
    attention_mask: np.ndarray,
    steps: int,
    eos_ids: list[int],
    padding_id: int,
) -> Generated:
    """transformers' own `generate(do_sample=False)` on a left-padded batch: the tokens and their logits.

    Plain greedy: a fresh GenerationConfig, so no repetition penalty or minimum length the model's
    generation_config.json may set changes the choice (the graph computes logits, not those rules)."""
    from transformers import GenerationConfig

    ids, mask = torch.from_numpy(input_ids), torch.from_numpy(attention_mask)
    config = GenerationConfig(
        max_new_tokens=steps,
        do_sample=False,
        eos_token_id=eos_ids,
        pad_token_id=padding_id,
        output_logits=True,
        return_dict_in_generate=True,
    )
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, generation_config=config)
    tokens = out.sequences[:, ids.shape[1] :].numpy().astype(np.int64)
    logits = torch.stack(out.logits, dim=1).float().numpy()  # [B, steps taken, vocab]
    return Generated(tokens, logits, ended(tokens, eos_ids))
