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

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from pipeline.artifact.generation import DECODE_IN_PLACE, LOGITS_FROM, PRESENT_NEW_ONLY, CacheLayout
from pipeline.runtime.external_data import SMALL_TENSOR, data_file

# pre-norm decoders: RMSNorm, rotary attention, a SiLU-gated MLP (Gemma's: tanh-GELU-gated)
FAMILIES = frozenset({"gemma2", "gemma3_text", "llama", "mistral", "phi3", "qwen2", "qwen3"})
# (1 + weight) norms, four a layer, embeddings scaled by sqrt(hidden), soft-capped scores and logits
GEMMA = frozenset({"gemma2", "gemma3_text"})
STATIC_ROPE = frozenset({"default", "linear", "llama3", "yarn"})  # tables fixed by position: computed once here
MS = "com.microsoft"
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


@dataclass
class _Graph:
    """Nodes and weights as they are added; with `data` (a model past EXTERNAL_BYTES), each weight of 1 KiB and more
    is written to that file as it comes and the graph keeps only where it lies, so no second copy of the model
    is held in memory."""

    nodes: list[onnx.NodeProto]
    weights: list[onnx.TensorProto]
    data: BinaryIO | None = None
    location: str = ""
    made: int = 0  # nodes made so far, branches' included: each node's name is unique

    def weight(self, name: str, value: np.ndarray) -> str:
        contiguous = value if value.flags.c_contiguous else np.ascontiguousarray(value)  # which makes a scalar 1-D
        if self.data is None or contiguous.nbytes < SMALL_TENSOR:
            self.weights.append(numpy_helper.from_array(contiguous, name))
            return name
        tensor = onnx.TensorProto(name=name, dims=contiguous.shape,
                                  data_type=helper.np_dtype_to_tensor_dtype(contiguous.dtype))  # fmt: skip
        offset = self.data.tell()
        contiguous.tofile(self.data)
        tensor.data_location = onnx.TensorProto.EXTERNAL
        for key, v in (("location", self.location), ("offset", offset), ("length", contiguous.nbytes)):
            tensor.external_data.add(key=key, value=str(v))
        self.weights.append(tensor)
        return name

    def shared(self, name: str, value: np.ndarray) -> str:
        """A small constant several nodes read, added the first time it is named."""
        if not any(w.name == name for w in self.weights):
            self.weight(name, value)
        return name

    def node(self, op: str, inputs: list[str], outputs: list[str], domain: str = "", **attrs: Any) -> list[str]:
        self.nodes.append(helper.make_node(op, inputs, outputs, name=f"{op}_{self.made}", domain=domain, **attrs))
        self.made += 1
        return outputs

    def branch(self, name: str, make: Callable[[], list[str]]) -> onnx.GraphProto:
        """A subgraph of the nodes `make` adds (their weights stay in the graph), its outputs the names it returns."""
        outer, self.nodes = self.nodes, []
        try:
            outputs = make()
            made = self.nodes
        finally:
            self.nodes = outer
        return helper.make_graph(
            made, name, [], [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
        )


def write_decoder(model: torch.nn.Module, layout: CacheLayout, path: Path, opset: int) -> bool:
    """The decoder at `path` (weights beside it past 1.8 GB, as `<file>.data`); returns whether they went beside it."""
    data = data_file(path)
    data.unlink(missing_ok=True)
    if sum(t.numel() * t.element_size() for t in model.state_dict().values()) <= EXTERNAL_BYTES:
        return _write(model, layout, path, opset, _Graph([], []))
    with data.open("wb") as file:
        return _write(model, layout, path, opset, _Graph([], [], file, data.name))


def _write(model: torch.nn.Module, layout: CacheLayout, path: Path, opset: int, g: _Graph) -> bool:
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
    _mask_bias(g, heads // kv, sorted({w for w in windows if w}))
    _row_lengths(g)
    eps = float(config.rms_norm_eps)
    g.node("Gather", [g.weight("embed_tokens", weights["model.embed_tokens.weight"]), "input_ids"], ["h0"], axis=0)
    x = _rms_norm(g, "h0", weights["model.layers.0.input_layernorm.weight"], eps)
    residual = "h0"
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        rotary = tables[None] if None in tables else tables[layer_types[i]]
        x_mlp, residual = _attention(
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
        _soft_cap(g, "logits_uncapped", "logits_cap", cap, "logits")
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


def _rotary_tables(g: _Graph, model: torch.nn.Module, size: int) -> dict[str | None, list[str]]:
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


def _soft_cap(g: _Graph, x: str, name: str, cap: float, out: str) -> str:
    """cap x tanh(x / cap), Gemma's soft-capping of attention scores and logits."""
    g.node("Div", [x, g.weight(name, np.array(cap, np.float32))], [name + "_scaled"])
    g.node("Tanh", [name + "_scaled"], [name + "_tanh"])
    return g.node("Mul", [name + "_tanh", name], [out])[0]


def _mask_bias(g: _Graph, group: int, windows: list[int]) -> None:
    """`bias` [batch, 1, group x sequence, total]: 0 where a query may attend (the column is in its row's mask and
    not after the query's own column), the float minimum elsewhere, as eager attention's mask; the query heads
    of a KV head stacked along the sequence (the attention's layout below). For each of the `windows`,
    `bias_window_<size>` too, for the layers of that window: a key is seen only when the query's position less
    the key's is under the window, a key's position being the count of held columns before it
    (pipeline/runtime/decoder.py `window_masks`: a cache with holes between a row's tokens is windowed by
    positions, not columns)."""
    i64 = np.int64
    g.weight("zero", np.array(0, i64))
    g.weight("one", np.array(1, i64))
    g.weight("axis_1", np.array([1], i64))
    g.weight("axes_1_2", np.array([1, 2], i64))
    g.node("Shape", ["attention_mask"], ["total_1d"], start=1, end=2)
    g.node("Shape", ["input_ids"], ["sequence_1d"], start=1, end=2)
    g.node("Squeeze", ["total_1d"], ["total"])
    g.node("Sub", ["total_1d", "sequence_1d"], ["past_1d"])
    g.node("Squeeze", ["past_1d"], ["past"])
    g.node("Concat", ["past_1d", "sequence_1d"], ["past_and_new"], axis=0)  # the attention's split of its weights
    g.node("Range", ["zero", "total", "one"], ["columns"])
    g.node("Range", ["past", "total", "one"], ["query_columns"])
    g.node("Unsqueeze", ["query_columns", "axis_1"], ["query_column"])
    g.node("LessOrEqual", ["columns", "query_column"], ["causal"])  # [sequence, total]
    g.node("Cast", ["attention_mask"], ["owned"], to=TensorProto.BOOL)
    g.node("Unsqueeze", ["owned", "axes_1_2"], ["owned_4d"])  # [batch, 1, 1, total]
    g.node("And", ["causal", "owned_4d"], ["allowed"])
    minimum = g.weight("float_min", np.array(np.finfo(np.float32).min, np.float32))
    g.node("Where", ["allowed", g.weight("float_zero", np.array(0, np.float32)), minimum], ["bias_1"])
    g.node("Tile", ["bias_1", g.weight("group_tiles", np.array([1, 1, group, 1], i64))], ["bias"])
    if not windows:
        return
    g.node("CumSum", ["attention_mask", g.weight("axis_1_scalar", np.array(1, i64))], ["held_before"])
    g.node("Sub", ["held_before", "one"], ["key_position"])  # [batch, total]
    g.node("Unsqueeze", ["key_position", "axis_1"], ["key_position_3d"])  # [batch, 1, total]
    g.node("Unsqueeze", ["position_ids", g.weight("axis_2", np.array([2], i64))], ["query_position"])
    g.node("Sub", ["query_position", "key_position_3d"], ["behind"])  # [batch, sequence, total]
    g.node("Unsqueeze", ["behind", "axis_1"], ["behind_4d"])  # [batch, 1, sequence, total]
    for window in windows:
        w = f"window_{window}"
        g.node("Less", ["behind_4d", g.weight(w, np.array(window, i64))], [w + "_within"])
        g.node("And", ["allowed", w + "_within"], [w + "_allowed"])
        g.node("Where", [w + "_allowed", "float_zero", minimum], [w + "_bias_1"])
        g.node("Tile", [w + "_bias_1", "group_tiles"], ["bias_" + w])


def _rms_norm(
    g: _Graph, x: str, weight: np.ndarray, eps: float, name: str = "norm0", out: str = "x0", fusable: bool = False
) -> str:
    """RMSNorm over the last axis in standard ops (onnxruntime's SimplifiedLayerNormalization is not ONNX's: the
    checker refuses it): the first layer's, and Qwen3's per head. `fusable` squares by Pow(x, 2), the pattern
    onnxruntime's optimizer fuses into its kernel (Qwen3's head norms, two a layer); the first layer's squares by
    Mul(x, x), which it leaves as six nodes, once a graph (kept so: the written Llama graph is unchanged)."""
    if fusable:
        g.node("Pow", [x, g.shared("float_two", np.array(2, np.float32))], [name + "_squares"])
    else:
        g.node("Mul", [x, x], [name + "_squares"])
    g.node("ReduceMean", [name + "_squares", g.shared("axis_last", np.array([-1], np.int64))], [name + "_mean"])
    g.node("Add", [name + "_mean", g.weight(name + "_eps", np.array(eps, np.float32))], [name + "_var"])
    g.node("Sqrt", [name + "_var"], [name + "_rms"])
    g.node("Div", [x, name + "_rms"], [name + "_unit"])
    return g.node("Mul", [name + "_unit", g.weight(name + "_weight", weight)], [out])[0]


def _reshape(g: _Graph, x: str, name: str, shape: list[int]) -> str:
    return g.node("Reshape", [x, g.weight(name + "_shape", np.array(shape, np.int64))], [name])[0]


def _linear(g: _Graph, x: str, name: str, weights: dict[str, np.ndarray], keys: list[str]) -> str:
    """x @ the named projections' weights side by side, plus their biases when any has one (zeros for the rest)."""
    matrices = [weights[k + ".weight"] for k in keys]
    out = g.node("MatMul", [x, g.weight(name, np.concatenate(matrices).T)], [name + "_out"])[0]
    if any(k + ".bias" in weights for k in keys):
        zeros = [np.zeros(m.shape[0], np.float32) for m in matrices]
        parts = [weights.get(k + ".bias", z) for k, z in zip(keys, zeros, strict=True)]
        out = g.node("Add", [out, g.weight(name + "_bias", np.concatenate(parts))], [name + "_biased"])[0]
    return out


def _row_lengths(g: _Graph) -> None:
    """For `decode_in_place`: each row's tokens before the new one (`seqlens`, int32 [batch]: its mask's count less
    one, a row's tokens being its columns 0..) and the longest row with it (`total_tokens`, an int32 scalar), as
    GroupQueryAttention takes them."""
    g.node("ReduceSum", ["attention_mask", "axis_1"], ["row_tokens"], keepdims=0)
    g.node("Sub", ["row_tokens", "one"], ["row_past"])
    g.node("Cast", ["row_past"], ["seqlens"], to=TensorProto.INT32)
    g.node("ReduceMax", ["row_tokens"], ["longest_row"], keepdims=0)
    g.node("Cast", ["longest_row"], ["total_tokens"], to=TensorProto.INT32)


def _attention(
    g: _Graph, i: int, x: str, residual: str, weights: dict[str, np.ndarray], p: str,
    heads: int, kv: int, size: int, scaling: float, eps: float, window: int | None, rotary: list[str],
    softcap: float | None,
) -> tuple[str, str]:  # fmt: skip
    """Layer i's attention on the normed `x`, added to `residual`, then normed for the MLP: (normed, residual).
    Its rotation by `rotary` (the cos and sin tables of its layer type); Gemma's scores soft-capped by `softcap`
    (GroupQueryAttention's `softcap`: cap x tanh(scores / cap), after the scaling, before the mask), its output
    RMS-normed by `post_attention_layernorm` before the residual add and the sum normed by
    `pre_feedforward_layernorm`.

    One If on `decode_in_place` gives the attention's output and the layer's presents: fed True,
    GroupQueryAttention reads each row's cache where it lies in the past buffers and writes the new keys and
    values after the row's last token (in place when the presents are bound to the pasts' memory), one kernel
    for what is otherwise some twenty nodes; else the grouped products of `_grouped`. A layer with a sliding
    `window` (in positions) sees only the keys of the last `window` positions, its own included: the kernel's
    `local_window_size` is that window (onnxruntime 1.32's CPU kernel counts the query's own key in it: with
    window - 1 a row decoded in place differed from the model), its columns positions as a row's tokens sit
    from column 0; the grouped products take its `bias_window_<size>`."""
    n = f"layer{i}."
    attn = p + "self_attn."
    qkv = _linear(g, x, n + "qkv", weights, [attn + "q_proj", attn + "k_proj", attn + "v_proj"])
    past = [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
    local = {} if window is None else {"local_window_size": window}
    if softcap:
        local["softcap"] = float(softcap)

    def split() -> list[str]:
        sizes = g.weight(n + "qkv_split", np.array([heads * size, kv * size, kv * size], np.int64))
        return g.node("Split", [qkv, sizes], [n + "q", n + "k", n + "v"], axis=-1)

    # Qwen3: each head's queries and keys RMS-normed before the rotation, for both branches (onnxruntime's CPU
    # kernel rejects GroupQueryAttention's own q_norm_weight input); the kernel then takes them apart, not packed
    head_normed = attn + "q_norm.weight" in weights
    if head_normed:
        q, k, v = split()
        q = _head_norm(g, q, n + "q", weights[attn + "q_norm.weight"], heads, size, eps)
        k = _head_norm(g, k, n + "k", weights[attn + "k_norm.weight"], kv, size, eps)
        projected = [q, k, v]
    else:
        projected = [qkv, "", ""]

    def in_place() -> list[str]:  # queries, keys and values (packed but for Qwen3); rotated at each row's length
        return g.node("GroupQueryAttention", [*projected, *past, "seqlens", "total_tokens", *rotary],
                      [n + "gqa_out", n + "gqa_key", n + "gqa_value"], domain=MS, num_heads=heads, kv_num_heads=kv,
                      scale=scaling, do_rotary=1, **local)  # fmt: skip

    def grouped() -> list[str]:
        q, k, v = projected if head_normed else split()
        tables = ["position_ids", *rotary]
        q = g.node("RotaryEmbedding", [q, *tables], [n + "q_rotated"], domain=MS, num_heads=heads)[0]
        k = g.node("RotaryEmbedding", [k, *tables], [n + "k_rotated"], domain=MS, num_heads=kv)[0]
        bias = "bias" if window is None else f"bias_window_{window}"
        return _grouped(g, n, q, k, v, past, heads, kv, size, scaling, bias, softcap)

    g.node("If", [DECODE_IN_PLACE], [n + "attention", f"present.{i}.key", f"present.{i}.value"],
           then_branch=g.branch(n + "in_place", in_place), else_branch=g.branch(n + "grouped", grouped))  # fmt: skip
    out = _linear(g, n + "attention", n + "o", weights, [attn + "o_proj"])
    if p + "pre_feedforward_layernorm.weight" in weights:  # Gemma: the output normed, then the MLP's own norm
        post = weights[p + "post_attention_layernorm.weight"]
        out = _rms_norm(g, out, post, eps, n + "attention_norm", n + "attention_normed", fusable=True)
        norm = g.weight(n + "mlp_norm", weights[p + "pre_feedforward_layernorm.weight"])
    else:
        norm = g.weight(n + "mlp_norm", weights[p + "post_attention_layernorm.weight"])
    normed, _, _, summed = g.node("SkipSimplifiedLayerNormalization", [out, residual, norm],
                                  [n + "mlp_in", "", "", n + "attended"], domain=MS, epsilon=eps)  # fmt: skip
    return normed, summed


def _head_norm(g: _Graph, x: str, name: str, weight: np.ndarray, heads: int, size: int, eps: float) -> str:
    """`x` [batch, sequence, heads x size] with each head's vector RMS-normed by `weight` [size] (Qwen3's q_norm and
    k_norm): Reshape, the norm, Reshape, which onnxruntime's optimizer makes one SimplifiedLayerNormalization."""
    heads_apart = _reshape(g, x, name + "_heads", [0, 0, heads, size])
    normed = _rms_norm(g, heads_apart, weight, eps, name + "_norm", name + "_normed_heads", fusable=True)
    return _reshape(g, normed, name + "_normed", [0, 0, heads * size])


def _grouped(
    g: _Graph, n: str, q: str, k: str, v: str, past: list[str], heads: int, kv: int, size: int, scaling: float,
    bias: str, softcap: float | None = None,
) -> list[str]:  # fmt: skip
    """The attention as grouped matrix products over the past and the new keys apart, and the layer's presents:
    [output, present key, present value]."""
    group = heads // kv
    # queries [batch, kv, group x sequence, size]: a KV head's query heads stacked, read against its keys once
    g.node("Transpose", [_reshape(g, q, n + "q_5d", [0, 0, kv, group, size])], [n + "q_grouped"], perm=[0, 2, 3, 1, 4])
    queries = _reshape(g, n + "q_grouped", n + "q_4d", [0, 0, -1, size])
    news = []
    for kind, new in (("key", k), ("value", v)):
        heads_first = _reshape(g, new, n + kind + "_4d", [0, 0, kv, size])
        news += g.node("Transpose", [heads_first], [n + kind + "_heads"], perm=[0, 2, 1, 3])
    # the past and the new keys scored apart and the weights split again: the cache is read where it lies, never
    # copied into a concatenation here (the presents are concatenated only when asked: below)
    for part, keys in (("past", past[0]), ("new", news[0])):
        g.node("Transpose", [keys], [n + part + "_keys_t"], perm=[0, 1, 3, 2])
        g.node("MatMul", [queries, n + part + "_keys_t"], [n + part + "_scores"])
    g.node("Concat", [n + "past_scores", n + "new_scores"], [n + "scores"], axis=-1)
    scaled = g.node("Mul", [n + "scores", g.weight(n + "scaling", np.array(scaling, np.float32))], [n + "scaled"])[0]
    if softcap:
        scaled = _soft_cap(g, scaled, n + "softcap", softcap, n + "capped")
    g.node("Add", [scaled, bias], [n + "masked"])
    g.node("Softmax", [n + "masked"], [n + "weights"], axis=-1)
    g.node("Split", [n + "weights", "past_and_new"], [n + "past_weights", n + "new_weights"], axis=-1)
    g.node("MatMul", [n + "past_weights", past[1]], [n + "past_context"])
    g.node("MatMul", [n + "new_weights", news[1]], [n + "new_context"])
    g.node("Add", [n + "past_context", n + "new_context"], [n + "context"])
    context = _reshape(g, n + "context", n + "c_5d", [0, 0, group, -1, size])
    g.node("Transpose", [context], [n + "c_tokens"], perm=[0, 3, 1, 2, 4])
    output = _reshape(g, n + "c_tokens", n + "c_3d", [0, 0, heads * size])

    # the presents: past and new concatenated (the contract), or, with `present_new_only` fed True, the new only
    def new_only() -> list[str]:
        return [g.node("Identity", [new], [new + "_only"])[0] for new in news]

    def whole() -> list[str]:
        return [g.node("Concat", [old, new], [new + "_whole"], axis=2)[0] for old, new in zip(past, news, strict=True)]

    presents = [n + "present_key", n + "present_value"]
    g.node("If", [PRESENT_NEW_ONLY], presents,
           then_branch=g.branch(n + "new", new_only), else_branch=g.branch(n + "whole", whole))  # fmt: skip
    return [output, *presents]


def _mlp(
    g: _Graph, i: int, x: str, residual: str, weights: dict[str, np.ndarray], p: str, norm: np.ndarray, eps: float,
    gemma: bool = False,
) -> tuple[str, str]:  # fmt: skip
    """Layer i's SiLU-gated MLP on the normed `x`, added to `residual`, then normed by the next layer's (or the
    final) norm: (normed, residual). Gemma's is gated by GELU's tanh approximation (onnxruntime's FastGelu, the
    same formula at any opset) and its output RMS-normed by `post_feedforward_layernorm` before the add."""
    n = f"layer{i}."
    gate = _linear(g, x, n + "gate", weights, [p + "mlp.gate_proj"])
    up = _linear(g, x, n + "up", weights, [p + "mlp.up_proj"])
    if gemma:
        activated = g.node("FastGelu", [gate], [n + "gate_gelu"], domain=MS)[0]
    else:
        g.node("Sigmoid", [gate], [n + "gate_sigmoid"])
        activated = g.node("Mul", [gate, n + "gate_sigmoid"], [n + "gate_silu"])[0]
    g.node("Mul", [activated, up], [n + "gated"])
    out = _linear(g, n + "gated", n + "down", weights, [p + "mlp.down_proj"])
    if gemma:
        post = weights[p + "post_feedforward_layernorm.weight"]
        out = _rms_norm(g, out, post, eps, n + "mlp_out_norm", n + "mlp_out_normed", fusable=True)
    normed, _, _, summed = g.node("SkipSimplifiedLayerNormalization", [out, residual, g.weight(n + "next_norm", norm)],
                                  [n + "out_normed", "", "", n + "out"], domain=MS, epsilon=eps)  # fmt: skip
    return normed, summed
