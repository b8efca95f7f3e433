"""A Llama-family decoder written straight to ONNX with onnxruntime's fused kernels; the cache contract unchanged.

Written: Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma 2 and Gemma 3 (FAMILIES; `refusal` names why any other model
is traced).

The traced export (lm_module.py) writes each layer as the dozens of small ops eager PyTorch runs: RMSNorm as
Pow, ReduceMean, Add, Sqrt, Reciprocal and two Muls, rotary embeddings as Slices, Negs, Concats and Muls, three
projections for queries, keys and values and two for the MLP. At one sequence a decode step is a few
milliseconds of matrix-vector products, and those ops' dispatch is a large part of it. This module writes
the same arithmetic from the model's weights with one node where onnxruntime has a kernel for it:
`SkipSimplifiedLayerNormalization` (the residual add and the next RMSNorm), `RotaryEmbedding` (at the
graph's `position_ids`, from tables the model's own rotary module computes, its scaling included), one
MatMul for queries, keys and values together. The MLP's gate and up projections stay two MatMuls: one MatMul
of both needs a Split after it, 0.45 ms of a 27 ms step at one sequence on the 135M bench model. Attention is
grouped matrix products over the past and the new keys apart, as grouped_attention.py traces it (no key
repeated per query head): onnxruntime's `GroupQueryAttention` there, given the mask as a bias so that any
padding is hidden, was 5-20% slower at 16 sequences on the 135M bench model. On that model a decode step of
one sequence is 1.07x faster than the traced graph's in fp32 and 1.22x with int4 weights; at 16 sequences
the two are level within the machine's noise (bench/bench_decoder_graphs.py; docs/language-models.md).

The graph takes and gives what the traced one does (lm_module.py, docs/language-models.md): input_ids,
attention_mask [batch, past + sequence] (0 for a hole or padding, anywhere), position_ids, one past key and
value per layer; logits for every position and the presents (past + new, concatenated). Three inputs are
added, with defaults: `logits_from` (int64 scalar, 0) is the first column whose logits are computed, so a
server prefilling prompts that end in the last column feeds -1 and skips the vocabulary projection of
every other position (on the 135M bench model a fifth of a prefill's arithmetic, and 384 MiB of logits
for a 2,048-token burst); a runtime that does not know it gets every position's. `present_new_only` (bool,
False) makes the presents the new tokens' keys and values only, for a server that keeps the cache itself.
`decode_in_place` (bool, False) switches each layer's attention, by an If, to `GroupQueryAttention` over
pasts that are whole buffers, each row's tokens from column 0 (their count from the mask, the new token's
position that count), the packed projection rotated inside the kernel, writing each row's new keys and
values after its last; bound to the pasts' memory, the presents are that append. pipe serve makes its
session with the input a constant True, so that onnxruntime folds the Ifs away, and runs every call so,
prefills included (serve/session.py, serve/generation/scheduler.py). The kernel has no mask then; on
that layout a step is level with onnxruntime-genai's builder graph, the same kernels layer for layer,
within 1-3% either way (bench/bench_decode_in_place.py, bench/bench_decode_step_parts.py;
docs/language-models.md). It runs on onnxruntime only (com.microsoft kernels; on CUDA, GroupQueryAttention
has fp16 and bf16 kernels only, so the fp32 in-place branch has none there); the export gate then
compares it with the model run eagerly, as for any export.

Sliding windows (Mistral's and Phi-3's `sliding_window` on every layer, Qwen2's and Qwen3's
`use_sliding_window` on the layers their `layer_types` name, from `max_window_layers` on: the cache record's
`windows`, pipeline/artifact/generation.py, which pipeline/runtime/decoder.py reads) are measured in
positions, as the traced graph's (pipeline/runtime/decoder.py `window_masks`): every layer keeps its whole
past, and a windowed layer's query sees the keys of the last `window` positions, its own included. The
grouped products add that to the mask's bias (a key's position the count of held columns before it, so holes
in a server's cache do not move the window); `GroupQueryAttention` takes it as `local_window_size`, its
rows' columns being positions. Qwen3's query and key norms (an RMSNorm of each head's vector, before the
rotation) are written in standard ops on the split projection, before the If: onnxruntime's CPU
`GroupQueryAttention` rejects its own `q_norm_weight`, so the in-place kernel takes the normed queries, keys
and values apart and still rotates them. Phi-3's packed `qkv_proj` and `gate_up_proj` are split as the
weights are read, so it is written as a Llama, with the default rope only (transformers' Phi3Config takes no
other but longrope); its long-context models' longrope (`su` in older configs) is not a table fixed by
position and is refused by name, as a rotary turning only part of each head is.

Gemma 2 and 3 (GEMMA) are Llamas with four changes, each written from what transformers 5.24's modeling files
do. Their RMSNorms scale by (1 + weight): the 1 is folded into every norm's weight as it is read. A layer has
four: the attention's output is RMS-normed (`post_attention_layernorm`, in standard ops squared by Pow, the
pattern onnxruntime fuses) before the residual add, whose SkipSimplifiedLayerNormalization norms by
`pre_feedforward_layernorm`, and the MLP's output likewise by `post_feedforward_layernorm` before its add.
The embeddings are scaled by sqrt(hidden) in the model's dtype (the embedding's `embed_scale`, folded into
the table). The MLP's gate is GELU's tanh approximation (`gelu_pytorch_tanh`): onnxruntime's FastGelu, the same
formula at any opset. Gemma 2's scores are soft-capped, cap x tanh(scores / cap) after the scaling
(`query_pre_attn_scalar` ** -0.5, the attention's `scaling`) and before the mask, in standard ops on the
grouped products and by GroupQueryAttention's `softcap`; Gemma 3's attention in transformers ignores its
config's `attn_logit_softcapping`, and so does the graph. Both cap the logits by `final_logit_softcapping`.
Gemma 3 norms each head's queries and keys as Qwen3 and rotates its sliding layers by the local base's tables
(`cos_cache_sliding_attention`), its full layers by the global base's with its scaling
(`cos_cache_full_attention`), for RotaryEmbedding and GroupQueryAttention alike. Bidirectional attention
(`use_bidirectional_attention`) is refused by name.
Families `refusal` names (another MLP, dynamic rope scaling, Gemma 3's multimodal model...) are traced as
before.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper

from pipeline.artifact.generation import DECODE_IN_PLACE, LOGITS_FROM, PRESENT_NEW_ONLY, CacheLayout
from pipeline.export.fused_attention import layer_attention, mask_bias, row_lengths
from pipeline.export.graph_writer import MS, Graph, linear, rms_norm, soft_cap
from pipeline.runtime.external_data import data_file

# pre-norm decoders: RMSNorm, rotary attention, a SiLU-gated MLP (Gemma's: tanh-GELU-gated)
FAMILIES = frozenset({"gemma2", "gemma3_text", "llama", "mistral", "phi3", "qwen2", "qwen3"})
# (1 + weight) norms, four a layer, embeddings scaled by sqrt(hidden), soft-capped scores and logits
GEMMA = frozenset({"gemma2", "gemma3_text"})
STATIC_ROPE = frozenset({"default", "linear", "llama3", "yarn"})  # tables fixed by position: computed once here
EXTERNAL_BYTES = 1_800_000_000  # past this the weights go beside the graph (protobuf's 2 GB limit)


def refusal(model: torch.nn.Module) -> str | None:
    """Why the model cannot be written by this module (None: it can)."""
    config = getattr(model, "config", None)
    family = getattr(config, "model_type", None)
    if family not in FAMILIES:
        return f"model type {family!r} is not one of {sorted(FAMILIES)}"
    activation, wanted = (
        (getattr(config, "hidden_activation", None), "gelu_pytorch_tanh")
        if family in GEMMA
        else (getattr(config, "hidden_act", None), "silu")
    )
    if activation != wanted:
        return f"its MLP activation is {activation!r}, not {wanted}"
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    kinds = _rope_types(rotary)
    for kind in kinds.values():
        if kind not in STATIC_ROPE:
            return f"its rope scaling {kind!r} is not one of {sorted(STATIC_ROPE)}"
    layers = getattr(model.model, "layers", None)
    attention = getattr(layers[0], "self_attn", None) if layers else None
    if attention is None or not hasattr(attention, "scaling") or not hasattr(attention, "head_dim"):
        return "its attention module is not transformers' Llama-style one"
    if None not in kinds and set(getattr(config, "layer_types", None) or ()) - set(kinds):
        return "its rotary embedding has no table for some of its layer types"
    for layer_type in kinds:
        frequencies = getattr(rotary, "inv_freq" if layer_type is None else f"{layer_type}_inv_freq", None)
        if frequencies is None or 2 * frequencies.numel() != attention.head_dim:
            return "its rotary embedding does not turn the whole of each head"  # a partial_rotary_factor (Phi-4-mini)
    if getattr(config, "use_bidirectional_attention", False):
        return "its attention is bidirectional"
    if config.num_attention_heads % config.num_key_value_heads:
        return "its query heads are not a multiple of its KV heads"
    return None


def _rope_types(rotary: torch.nn.Module | None) -> dict[str | None, str | None]:
    """Each rotary table's rope type by the layer type it turns (Gemma 3's `rope_type` is a dict: its sliding
    layers' local base and its full layers' global one); one table for every layer is under None."""
    kind = getattr(rotary, "rope_type", None)
    return dict(kind) if isinstance(kind, dict) else {None: kind}


def write_decoder(model: torch.nn.Module, layout: CacheLayout, path: Path, opset: int) -> bool:
    """The decoder at `path` (weights beside it past 1.8 GB, as `<file>.data`); returns whether they went beside it."""
    data = data_file(path)
    data.unlink(missing_ok=True)
    if sum(t.numel() * t.element_size() for t in model.state_dict().values()) <= EXTERNAL_BYTES:
        return _write(model, layout, path, opset, Graph([], []))
    with data.open("wb") as file:
        return _write(model, layout, path, opset, Graph([], [], file, data.name))


def _write(model: torch.nn.Module, layout: CacheLayout, path: Path, opset: int, g: Graph) -> bool:
    config = model.config
    weights = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    head = model.get_output_embeddings().weight.detach().float().numpy()
    attention = model.model.layers[0].self_attn
    heads, kv, size = config.num_attention_heads, layout.kv_heads, int(attention.head_dim)
    _unpack(weights, [heads * size, kv * size, kv * size])
    gemma = config.model_type in GEMMA
    if gemma:  # Gemma's RMSNorms scale by (1 + weight): the 1 folded in, for the kernels' plain weight
        for name in [k for k in weights if k.endswith("norm.weight")]:
            weights[name] = weights[name] + np.float32(1)
        embedding = model.model.embed_tokens  # scaled by sqrt(hidden) in the model's dtype, as transformers does
        scale = embedding.embed_scale.to(embedding.weight.dtype).float().numpy()
        weights["model.embed_tokens.weight"] = weights["model.embed_tokens.weight"] * scale
    tables = _rotary_tables(g, model, size)
    layer_types = getattr(config, "layer_types", None)
    # Gemma 2's scores soft-capped; Gemma 3's attention (transformers 5.24) ignores its config's attn_logit_softcapping
    softcap = getattr(config, "attn_logit_softcapping", None) if config.model_type == "gemma2" else None
    # each layer's sliding window in positions (None: the whole past), as the cache record keeps them
    windows = [w or None for w in layout.windows] if layout.windows else [None] * layout.layers
    mask_bias(g, heads // kv, sorted({w for w in windows if w}))
    row_lengths(g)
    eps = float(config.rms_norm_eps)
    g.node("Gather", [g.weight("embed_tokens", weights["model.embed_tokens.weight"]), "input_ids"], ["h0"], axis=0)
    x = rms_norm(g, "h0", weights["model.layers.0.input_layernorm.weight"], eps)
    residual = "h0"
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        rotary = tables[None] if None in tables else tables[layer_types[i]]
        x_mlp, residual = layer_attention(
            g, i, x, residual, weights, p, heads, kv, size, float(attention.scaling), eps, windows[i],
            rotary, softcap,
        )  # fmt: skip
        following = f"model.layers.{i + 1}.input_layernorm.weight"
        norm = weights[following] if following in weights else weights["model.norm.weight"]
        x, residual = _mlp(g, i, x_mlp, residual, weights, p, norm, eps, gemma)
    # logits from column `logits_from` on (a graph input with a default, 0: every position; -1: the last)
    g.weight(LOGITS_FROM, np.array(0, np.int64))
    g.weight(PRESENT_NEW_ONLY, np.array(False))
    g.weight(DECODE_IN_PLACE, np.array(False))
    g.node("Unsqueeze", [LOGITS_FROM, g.weight("axis_0", np.array([0], np.int64))], ["logits_start"])
    g.node("Slice", [x, "logits_start", g.weight("to_end", np.array([2**62], np.int64)), "axis_1"], ["logits_rows"])
    cap = getattr(config, "final_logit_softcapping", None) if gemma else None
    g.node("MatMul", ["logits_rows", g.weight("lm_head", head.T)], ["logits_uncapped" if cap else "logits"])
    if cap:  # Gemma: cap x tanh(logits / cap)
        soft_cap(g, "logits_uncapped", "logits_cap", cap, "logits")
    inputs = [*_inputs(layout), helper.make_tensor_value_info(LOGITS_FROM, TensorProto.INT64, []),
              helper.make_tensor_value_info(PRESENT_NEW_ONLY, TensorProto.BOOL, []),
              helper.make_tensor_value_info(DECODE_IN_PLACE, TensorProto.BOOL, [])]  # fmt: skip
    graph = helper.make_graph(g.nodes, "decoder", inputs, _outputs(layout, head.shape[0]), g.weights)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])
    proto.ir_version = 9  # opset 18's; onnxruntime-training's loader reads at most 10
    proto.producer_name = "pipe"
    onnx.save(proto, str(path))  # the weights already in `g.data` when there is one
    return g.data is not None


def _unpack(weights: dict[str, np.ndarray], qkv_rows: list[int]) -> None:
    """Phi-3's packed projections as the other families name them (views of the same arrays): `qkv_proj` split
    into `q_proj`, `k_proj` and `v_proj` by `qkv_rows`, `gate_up_proj` into `gate_proj` and `up_proj` halves."""
    bounds = np.cumsum(qkv_rows)[:-1]
    for name in [k for k in weights if k.endswith((".qkv_proj.weight", ".qkv_proj.bias"))]:
        base, kind = name.rsplit(".qkv_proj.", 1)
        for part, value in zip(("q_proj", "k_proj", "v_proj"), np.split(weights.pop(name), bounds), strict=True):
            weights[f"{base}.{part}.{kind}"] = value
    for name in [k for k in weights if k.endswith((".gate_up_proj.weight", ".gate_up_proj.bias"))]:
        base, kind = name.rsplit(".gate_up_proj.", 1)
        gate, up = np.split(weights.pop(name), 2)  # the first half gates (Phi3MLP: gate, up = chunk(2))
        weights[f"{base}.gate_proj.{kind}"], weights[f"{base}.up_proj.{kind}"] = gate, up


def _inputs(layout: CacheLayout) -> list[onnx.ValueInfoProto]:
    tokens = ["batch", "sequence"]
    made = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, tokens),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total_sequence"]),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, tokens),
    ]
    shape = ["batch", layout.kv_heads, "past_sequence", layout.head_size]
    return made + [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in layout.past_names()]


def _outputs(layout: CacheLayout, vocab: int) -> list[onnx.ValueInfoProto]:
    shape = ["batch", layout.kv_heads, "total_sequence", layout.head_size]
    logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence", vocab])
    return [logits] + [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in layout.present_names()]


def _rotary_tables(g: Graph, model: torch.nn.Module, size: int) -> dict[str | None, list[str]]:
    """cos and sin [max positions, head_size / 2] as the model's rotary module makes them (scaling included): their
    names by the layer type they turn (`_rope_types`: Gemma 3's `cos_cache_<type>` for each; else `cos_cache`)."""
    positions = torch.arange(model.config.max_position_embeddings)[None]
    rotary = model.model.rotary_emb
    tables: dict[str | None, list[str]] = {}
    for layer_type in sorted(_rope_types(rotary), key=str):
        by_type = () if layer_type is None else (layer_type,)
        with torch.no_grad():
            cos, sin = rotary(torch.zeros(1, dtype=torch.float32), positions, *by_type)
        suffix = "" if layer_type is None else f"_{layer_type}"
        tables[layer_type] = [g.weight("cos_cache" + suffix, cos[0, :, : size // 2].float().numpy()),
                              g.weight("sin_cache" + suffix, sin[0, :, : size // 2].float().numpy())]  # fmt: skip
    return tables


def _mlp(
    g: Graph, i: int, x: str, residual: str, weights: dict[str, np.ndarray], p: str, norm: np.ndarray, eps: float,
    gemma: bool = False,
) -> tuple[str, str]:  # fmt: skip
    """Layer i's SiLU-gated MLP on the normed `x`, added to `residual`, then normed by the next layer's (or the
    final) norm: (normed, residual). Gemma's is gated by GELU's tanh approximation (onnxruntime's FastGelu, the
    same formula at any opset) and its output RMS-normed by `post_feedforward_layernorm` before the add."""
    n = f"layer{i}."
    gate = linear(g, x, n + "gate", weights, [p + "mlp.gate_proj"])
    up = linear(g, x, n + "up", weights, [p + "mlp.up_proj"])
    if gemma:
        activated = g.node("FastGelu", [gate], [n + "gate_gelu"], domain=MS)[0]
    else:
        g.node("Sigmoid", [gate], [n + "gate_sigmoid"])
        activated = g.node("Mul", [gate, n + "gate_sigmoid"], [n + "gate_silu"])[0]
    g.node("Mul", [activated, up], [n + "gated"])
    out = linear(g, n + "gated", n + "down", weights, [p + "mlp.down_proj"])
    if gemma:
        post = weights[p + "post_feedforward_layernorm.weight"]
        out = rms_norm(g, out, post, eps, n + "mlp_out_norm", n + "mlp_out_normed", fusable=True)
    normed, _, _, summed = g.node("SkipSimplifiedLayerNormalization", [out, residual, g.weight(n + "next_norm", norm)],
                                  [n + "out_normed", "", "", n + "out"], domain=MS, epsilon=eps)  # fmt: skip
    return normed, summed
