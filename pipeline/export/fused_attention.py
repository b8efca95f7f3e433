"""A written decoder layer's attention (pipeline/export/fused_decoder.py): the mask as a bias, the row lengths
GroupQueryAttention reads, and the layer's attention as one If on `decode_in_place`, GroupQueryAttention over
the past buffers in place or grouped matrix products over the past and the new keys apart (the graph contract).
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from pipeline.artifact.generation import DECODE_IN_PLACE, PRESENT_NEW_ONLY
from pipeline.export.graph_writer import MS, Graph, linear, reshape, rms_norm, soft_cap


def mask_bias(g: Graph, group: int, windows: list[int]) -> None:
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


def row_lengths(g: Graph) -> None:
    """For `decode_in_place`: each row's tokens before the new one (`seqlens`, int32 [batch]: its mask's count less
    one, a row's tokens being its columns 0..) and the longest row with it (`total_tokens`, an int32 scalar), as
    GroupQueryAttention takes them."""
    g.node("ReduceSum", ["attention_mask", "axis_1"], ["row_tokens"], keepdims=0)
    g.node("Sub", ["row_tokens", "one"], ["row_past"])
    g.node("Cast", ["row_past"], ["seqlens"], to=TensorProto.INT32)
    g.node("ReduceMax", ["row_tokens"], ["longest_row"], keepdims=0)
    g.node("Cast", ["longest_row"], ["total_tokens"], to=TensorProto.INT32)


def layer_attention(
    g: Graph, i: int, x: str, residual: str, weights: dict[str, np.ndarray], p: str,
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
    for what is otherwise some twenty nodes; else the grouped products of `grouped_products`. A layer with a sliding
    `window` (in positions) sees only the keys of the last `window` positions, its own included: the kernel's
    `local_window_size` is that window (onnxruntime 1.32's CPU kernel counts the query's own key in it: with
    window - 1 a row decoded in place differed from the model), its columns positions as a row's tokens sit
    from column 0; the grouped products take its `bias_window_<size>`."""
    n = f"layer{i}."
    attn = p + "self_attn."
    qkv = linear(g, x, n + "qkv", weights, [attn + "q_proj", attn + "k_proj", attn + "v_proj"])
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
        q = head_norm(g, q, n + "q", weights[attn + "q_norm.weight"], heads, size, eps)
        k = head_norm(g, k, n + "k", weights[attn + "k_norm.weight"], kv, size, eps)
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
        return grouped_products(g, n, q, k, v, past, heads, kv, size, scaling, bias, softcap)

    g.node("If", [DECODE_IN_PLACE], [n + "attention", f"present.{i}.key", f"present.{i}.value"],
           then_branch=g.branch(n + "in_place", in_place), else_branch=g.branch(n + "grouped", grouped))  # fmt: skip
    out = linear(g, n + "attention", n + "o", weights, [attn + "o_proj"])
    if p + "pre_feedforward_layernorm.weight" in weights:  # Gemma: the output normed, then the MLP's own norm
        post = weights[p + "post_attention_layernorm.weight"]
        out = rms_norm(g, out, post, eps, n + "attention_norm", n + "attention_normed", fusable=True)
        norm = g.weight(n + "mlp_norm", weights[p + "pre_feedforward_layernorm.weight"])
    else:
        norm = g.weight(n + "mlp_norm", weights[p + "post_attention_layernorm.weight"])
    normed, _, _, summed = g.node("SkipSimplifiedLayerNormalization", [out, residual, norm],
                                  [n + "mlp_in", "", "", n + "attended"], domain=MS, epsilon=eps)  # fmt: skip
    return normed, summed


def head_norm(g: Graph, x: str, name: str, weight: np.ndarray, heads: int, size: int, eps: float) -> str:
    """`x` [batch, sequence, heads x size] with each head's vector RMS-normed by `weight` [size] (Qwen3's q_norm and
    k_norm): Reshape, the norm, Reshape, which onnxruntime's optimizer makes one SimplifiedLayerNormalization."""
    heads_apart = reshape(g, x, name + "_heads", [0, 0, heads, size])
    normed = rms_norm(g, heads_apart, weight, eps, name + "_norm", name + "_normed_heads", fusable=True)
    return reshape(g, normed, name + "_normed", [0, 0, heads * size])


def grouped_products(
    g: Graph, n: str, q: str, k: str, v: str, past: list[str], heads: int, kv: int, size: int, scaling: float,
    bias: str, softcap: float | None = None,
) -> list[str]:  # fmt: skip
    """The attention as grouped matrix products over the past and the new keys apart, and the layer's presents:
    [output, present key, present value]."""
    group = heads // kv
    # queries [batch, kv, group x sequence, size]: a KV head's query heads stacked, read against its keys once
    g.node("Transpose", [reshape(g, q, n + "q_5d", [0, 0, kv, group, size])], [n + "q_grouped"], perm=[0, 2, 3, 1, 4])
    queries = reshape(g, n + "q_grouped", n + "q_4d", [0, 0, -1, size])
    news = []
    for kind, new in (("key", k), ("value", v)):
        heads_first = reshape(g, new, n + kind + "_4d", [0, 0, kv, size])
        news += g.node("Transpose", [heads_first], [n + kind + "_heads"], perm=[0, 2, 1, 3])
    # the past and the new keys scored apart and the weights split again: the cache is read where it lies, never
    # copied into a concatenation here (the presents are concatenated only when asked: below)
    for part, keys in (("past", past[0]), ("new", news[0])):
        g.node("Transpose", [keys], [n + part + "_keys_t"], perm=[0, 1, 3, 2])
        g.node("MatMul", [queries, n + part + "_keys_t"], [n + part + "_scores"])
    g.node("Concat", [n + "past_scores", n + "new_scores"], [n + "scores"], axis=-1)
    scaled = g.node("Mul", [n + "scores", g.weight(n + "scaling", np.array(scaling, np.float32))], [n + "scaled"])[0]
    if softcap:
        scaled = soft_cap(g, scaled, n + "softcap", softcap, n + "capped")
    g.node("Add", [scaled, bias], [n + "masked"])
    g.node("Softmax", [n + "masked"], [n + "weights"], axis=-1)
    g.node("Split", [n + "weights", "past_and_new"], [n + "past_weights", n + "new_weights"], axis=-1)
    g.node("MatMul", [n + "past_weights", past[1]], [n + "past_context"])
    g.node("MatMul", [n + "new_weights", news[1]], [n + "new_context"])
    g.node("Add", [n + "past_context", n + "new_context"], [n + "context"])
    context = reshape(g, n + "context", n + "c_5d", [0, 0, group, -1, size])
    g.node("Transpose", [context], [n + "c_tokens"], perm=[0, 3, 1, 2, 4])
    output = reshape(g, n + "c_tokens", n + "c_3d", [0, 0, heads * size])

    # the presents: past and new concatenated (the contract), or, with `present_new_only` fed True, the new only
    def new_only() -> list[str]:
        return [g.node("Identity", [new], [new + "_only"])[0] for new in news]

    def whole() -> list[str]:
        return [g.node("Concat", [old, new], [new + "_whole"], axis=2)[0] for old, new in zip(past, news, strict=True)]

    presents = [n + "present_key", n + "present_value"]
    g.node("If", [PRESENT_NEW_ONLY], presents,
           then_branch=g.branch(n + "new", new_only), else_branch=g.branch(n + "whole", whole))  # fmt: skip
    return [output, *presents]
