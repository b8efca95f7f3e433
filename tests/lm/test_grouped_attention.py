"""Grouped-query attention exported without repeating the cache per query head (pipeline/export/grouped_attention.py):
the same logits as transformers' eager attention, in torch bitwise and in the imported graph through the export gate,
and a graph that no longer expands the keys and values."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from tests.lm.imported_lm import cached_llama
from tests.lm.lm_models import graph_nodes, save_llama

pytestmark = pytest.mark.slow  # the cached import of the tiny Llama (about 20 s of CPU when the cache lacks it)


def test_grouped_equals_eager_bitwise_and_only_while_exporting(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from pipeline.export.grouped_attention import applies, grouped_while

    source = save_llama(tmp_path / "llama")
    model = AutoModelForCausalLM.from_pretrained(source, attn_implementation="eager").eval()
    ids = torch.randint(3, 200, (3, 11), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding, as a prompt batch has it
    with torch.no_grad():
        eager = model(ids, attention_mask=mask).logits
        with grouped_while(model) as used:
            assert used and model.config._attn_implementation != "eager"
            grouped = model(ids, attention_mask=mask).logits
        assert model.config._attn_implementation == "eager"  # restored: the gate's reference runs eager
    assert torch.equal(grouped, eager)
    heads = AutoModelForCausalLM.from_pretrained(save_llama(tmp_path / "mha", num_key_value_heads=4))
    assert not applies(heads)  # one KV head per query head: nothing to group, the graph stays eager's


def test_the_imported_graph_reads_the_cache_without_expanding_it() -> None:
    """The tiny Llama's import (4 query heads on 2 KV heads) passed its parity gate with grouped attention; its
    graph has no Expand feeding an attention MatMul (eager's repeat_kv made one per layer for keys and values)."""
    graph = onnx.load(str(cached_llama(512) / "artifacts" / "tiny-llama" / "1" / "model.onnx")).graph
    made_by = {out: node for node in graph_nodes(graph) for out in node.output}

    def expanded(name: str, depth: int = 4) -> bool:
        node = made_by.get(name)
        if node is None or depth == 0:
            return False
        return node.op_type == "Expand" or any(expanded(i, depth - 1) for i in node.input)

    weights = {t.name for t in graph.initializer}
    matmuls = [n for n in graph_nodes(graph) if n.op_type == "MatMul" and not weights & set(n.input)]  # activations
    assert len(matmuls) >= 4  # two attention products a layer
    assert not [n.name for n in matmuls if any(expanded(i) for i in n.input)]
