"""Where a decode step's time goes, on pipe serve's session of the 135M bench model: what bounds a step at
many rows, and why another graph on onnxruntime's CPU kernels cannot be much faster.

    .venv/bin/python bench/bench_decode_step_parts.py [--dir /tmp/lm-serve-bench] [--rows 16] [--threads 2]
        [--out bench/results/decode_step_parts.json]

Three measurements, each on `--rows` rows decoding in place (the serve's session: `decode_in_place` a
constant True, every past bound as its present):
- `by_context`: the step at contexts of 16 to 384 tokens in a 512-wide buffer (three rounds, the contexts in
  turn each round; the median): the slope is what attention costs per token of context, the intercept
  the weights' MatMuls and the rest.
- `by_op`: onnxruntime's profile of 30 steps at a 192-token context, read as `pipe optimize` reads one
  (pipeline/optimize/profile.py): each kind of op's median kernel time a step, and its share (the profiler
  adds its own time: the shares are what to read, not the sum).
- `attention`: the attention of one step alone (30 layers, each its own cache, so they come from memory as
  in a step) at a 192-token context in a 256-wide buffer: GroupQueryAttention in place, as the serve's
  graph and onnxruntime-genai's builder graph both run it, against the same arithmetic as MatMuls that read
  the keys as the left operand ([width, head] x [head, group]: no copy or transposition of the cache) and a
  Softmax over the buffer's width, masked. Their outputs are compared too.
The model is bench/lm_serve_model.py's (a random Llama of SmolLM-135M's shape; random weights time the
kernels, which do not depend on the values).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from lm_serve_model import NAME, prepare  # noqa: E402

CONTEXTS = (16, 64, 128, 192, 256, 384)
PROFILED_CONTEXT = 192


def serve_session(root: Path, threads: int, profile: Path | None = None) -> Any:
    """pipe serve's session of the artifact (serve/session.py's constant), profiled into `profile` when given."""
    from pipeline.artifact.generation import DECODE_IN_PLACE
    from pipeline.runtime.session import create_session

    return create_session(root / "model.onnx", "cpu", threads, 1, True, profile=profile,
                          constants={DECODE_IN_PLACE: np.array(True)})  # fmt: skip


def step_binding(session: Any, cache: np.ndarray, context: int) -> Any:
    """A decode call of cache.shape[1] rows, each holding `context` tokens of the buffer, bound in place."""
    from onnxruntime import OrtValue

    rows, width = cache.shape[1], cache.shape[3]
    binding = session.io_binding()
    pasts = [i.name for i in session.get_inputs() if i.name.startswith("past_key_values.")]
    for name, tensor in zip(pasts, cache, strict=True):
        value = OrtValue.ortvalue_from_numpy(tensor)
        binding.bind_ortvalue_input(name, value)
        binding.bind_ortvalue_output(name.replace("past_key_values", "present"), value)
    mask = np.zeros((rows, width + 1), dtype=np.int64)
    mask[:, :context] = 1
    mask[:, -1] = 1
    feeds = {"input_ids": np.full((rows, 1), 5, dtype=np.int64), "attention_mask": mask,
             "position_ids": np.full((rows, 1), context, dtype=np.int64)}  # fmt: skip
    for name, value in feeds.items():
        binding.bind_ortvalue_input(name, OrtValue.ortvalue_from_numpy(value))
    binding.bind_output("logits")
    return binding


def timed(call: Any, repeats: int, warm: int = 2) -> float:
    """The median seconds of `repeats` calls after `warm` untimed ones."""
    for _ in range(warm):
        call()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return float(np.median(times))


def by_context(root: Path, rows: int, threads: int, layout: tuple[int, int, int]) -> dict[str, float]:
    layers, kv_heads, head = layout
    session = serve_session(root, threads)
    cache = (np.random.default_rng(0).standard_normal((2 * layers, rows, kv_heads, 512, head)) * 0.1).astype(np.float32)
    rounds: dict[int, list[float]] = {c: [] for c in CONTEXTS}
    for _ in range(3):
        for context in CONTEXTS:
            binding = step_binding(session, cache, context)
            rounds[context].append(timed(lambda b=binding: session.run_with_iobinding(b), 10))
    return {str(c): float(np.median(v)) * 1e3 for c, v in rounds.items()}


def by_op(root: Path, rows: int, threads: int, layout: tuple[int, int, int]) -> dict[str, Any]:
    import tempfile

    from pipeline.optimize.profile import WARMUP, read_profile

    layers, kv_heads, head = layout
    with tempfile.TemporaryDirectory() as scratch:
        session = serve_session(root, threads, profile=Path(scratch))
        cache = np.zeros((2 * layers, rows, kv_heads, 256, head), dtype=np.float32)
        binding = step_binding(session, cache, PROFILED_CONTEXT)
        for _ in range(WARMUP + 30):  # the reader leaves the first WARMUP out
            session.run_with_iobinding(binding)
        profile = read_profile(Path(session.end_profiling()), Path(scratch))
    total = profile.kernels_ms
    ops = {kind: {"ms_a_step": t.ms, "share": t.ms / total} for kind, t in profile.kinds.items()
           if t.ms >= 0.001 * total}  # fmt: skip
    return {"profiled_step_ms": profile.run_ms, "ops": ops}


def attention_graphs(heads: int, kv_heads: int, head: int, scale: float) -> tuple[bytes, bytes]:
    """One layer's decode attention two ways: GroupQueryAttention over a shared buffer (pipe serve's and the
    builder graph's kernel), and MatMuls reading the keys as the left operand with a masked Softmax."""
    from onnx import TensorProto, helper, numpy_helper

    group, f32 = heads // kv_heads, TensorProto.FLOAT

    def const(name: str, value: Any) -> Any:
        return numpy_helper.from_array(np.asarray(value), name)

    def info(name: str, shape: list[Any], kind: int = f32) -> Any:
        return helper.make_tensor_value_info(name, kind, shape)

    cache = [info("past_key", ["B", kv_heads, "W", head]), info("past_value", ["B", kv_heads, "W", head])]
    gqa = helper.make_node("GroupQueryAttention", ["qkv", "", "", "past_key", "past_value", "seqlens", "total"],
                           ["out", "present_key", "present_value"], domain="com.microsoft", num_heads=heads,
                           kv_num_heads=kv_heads, scale=scale)  # fmt: skip
    gqa_graph = helper.make_graph(
        [gqa], "gqa",
        [info("qkv", ["B", 1, (heads + 2 * kv_heads) * head]), *cache, info("seqlens", ["B"], TensorProto.INT32),
         info("total", [], TensorProto.INT32)],
        [info(n, None) for n in ("out", "present_key", "present_value")],
    )  # fmt: skip
    node = helper.make_node
    nodes = [
        node("Reshape", ["q", "q_shape"], ["q4"]),  # [B, kv, group, head]
        node("Transpose", ["q4"], ["q_t"], perm=[0, 1, 3, 2]),  # [B, kv, head, group]: small
        node("MatMul", ["past_key", "q_t"], ["scores_t"]),  # [B, kv, W, group]: the keys read as they lie
        node("Transpose", ["scores_t"], ["scores"], perm=[0, 1, 3, 2]),
        node("Mul", ["scores", "scale"], ["scaled"]),
        node("Add", ["scaled", "bias"], ["past_scores"]),  # bias [B, 1, 1, W]: 0 or the lowest float
        node("Reshape", ["k_new", "kv_shape"], ["k4"]),
        node("Mul", ["q4", "k4"], ["qk"]),
        node("ReduceSum", ["qk", "last"], ["new_dot"], keepdims=1),
        node("Mul", ["new_dot", "scale"], ["new_score"]),
        node("Concat", ["past_scores", "new_score"], ["all_scores"], axis=-1),
        node("Softmax", ["all_scores"], ["weights"], axis=-1),
        node("Slice", ["weights", "zero", "width", "last"], ["past_weights"]),
        node("Slice", ["weights", "width", "end", "last"], ["new_weight"]),
        node("MatMul", ["past_weights", "past_value"], ["past_context"]),
        node("Reshape", ["v_new", "kv_shape"], ["v4"]),
        node("Mul", ["new_weight", "v4"], ["new_context"]),
        node("Add", ["past_context", "new_context"], ["context"]),
        node("Reshape", ["context", "out_shape"], ["out"]),
    ]
    shapes = {"q_shape": [0, kv_heads, group, head], "kv_shape": [0, kv_heads, 1, head],
              "out_shape": [0, 1, heads * head]}  # fmt: skip
    constants = [*(const(name, np.array(shape)) for name, shape in shapes.items()),
                 const("scale", np.float32(scale)), const("zero", np.array([0])), const("last", np.array([-1])),
                 const("end", np.array([2**30]))]  # fmt: skip
    matmul_graph = helper.make_graph(
        nodes, "matmuls",
        [info("q", ["B", 1, heads * head]), info("k_new", ["B", 1, kv_heads * head]),
         info("v_new", ["B", 1, kv_heads * head]), *cache, info("bias", ["B", 1, 1, "W"]),
         info("width", [1], TensorProto.INT64)],
        [info("out", None)], constants,
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return (helper.make_model(gqa_graph, opset_imports=opsets).SerializeToString(),
            helper.make_model(matmul_graph, opset_imports=opsets[:1]).SerializeToString())  # fmt: skip


def attention(rows: int, threads: int, layout: tuple[int, int, int], heads: int, context: int = PROFILED_CONTEXT,
              width: int = 256) -> dict[str, float]:  # fmt: skip
    import onnxruntime as ort
    from onnxruntime import OrtValue

    layers, kv_heads, head = layout
    gqa_model, matmul_model = attention_graphs(heads, kv_heads, head, head**-0.5)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    rng = np.random.default_rng(0)
    keys = [rng.standard_normal((rows, kv_heads, width, head), dtype=np.float32) for _ in range(layers)]
    values = [rng.standard_normal((rows, kv_heads, width, head), dtype=np.float32) for _ in range(layers)]
    qkv = rng.standard_normal((rows, 1, (heads + 2 * kv_heads) * head), dtype=np.float32)
    q, k_new, v_new = np.split(qkv, [heads * head, (heads + kv_heads) * head], axis=-1)
    bias = np.where(np.arange(width) < context - 1, 0.0, np.finfo(np.float32).min).astype(np.float32)

    def bind(session: Any, feeds: dict[str, np.ndarray], in_place: bool) -> list[Any]:
        bindings = []
        for key, value in zip(keys, values, strict=True):
            binding = session.io_binding()
            for name, array in {**feeds, "past_key": key, "past_value": value}.items():
                bound = OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array))
                binding.bind_ortvalue_input(name, bound)
                if in_place and name.startswith("past_"):
                    binding.bind_ortvalue_output(name.replace("past", "present"), bound)
            binding.bind_output("out")
            bindings.append(binding)
        return bindings

    # GroupQueryAttention writes the new key and value at column context - 1 of each row, then attends over
    # the row's first `context` columns; the MatMuls mask every column from context - 1 and add the new apart
    gqa = ort.InferenceSession(gqa_model, options, providers=["CPUExecutionProvider"])
    gqa_bound = bind(gqa, {"qkv": qkv, "seqlens": np.full(rows, context - 1, np.int32),
                           "total": np.array(width, np.int32)}, in_place=True)  # fmt: skip
    matmuls = ort.InferenceSession(matmul_model, options, providers=["CPUExecutionProvider"])
    matmul_bound = bind(matmuls, {"q": q, "k_new": k_new, "v_new": v_new, "bias": np.tile(bias, (rows, 1, 1, 1)),
                                  "width": np.array([width])}, in_place=False)  # fmt: skip

    def layers_of(session: Any, bindings: list[Any]) -> Any:
        return lambda: [session.run_with_iobinding(b) for b in bindings]

    result = {"gqa_ms": timed(layers_of(gqa, gqa_bound), 10) * 1e3,
              "matmuls_ms": timed(layers_of(matmuls, matmul_bound), 10) * 1e3}  # fmt: skip
    result["max_difference"] = float(np.abs(gqa_bound[0].get_outputs()[-1].numpy()
                                            - matmul_bound[0].get_outputs()[0].numpy()).max())  # fmt: skip
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/lm-serve-bench"))
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "decode_step_parts.json")
    args = parser.parse_args()
    from pipeline.artifact.directory import Artifact

    _, repository = prepare(args.dir)
    root = repository / NAME / "1"
    generation = Artifact.load(root).manifest.generation
    assert generation is not None
    cache = generation.cache
    layout = (cache.layers, cache.kv_heads, cache.head_size)
    heads = json.loads((args.dir / "source" / "config.json").read_text())["num_attention_heads"]
    report: dict[str, Any] = {"rows": args.rows, "threads": args.threads}
    report["step_ms_by_context"] = by_context(root, args.rows, args.threads, layout)
    print("step ms by context:", {c: round(ms, 1) for c, ms in report["step_ms_by_context"].items()}, flush=True)
    report["by_op"] = by_op(root, args.rows, args.threads, layout)
    print(f"profiled step {report['by_op']['profiled_step_ms']:.1f} ms:",
          {op: f"{v['share']:.1%}" for op, v in report["by_op"]["ops"].items()}, flush=True)  # fmt: skip
    report["attention"] = attention(args.rows, args.threads, layout, heads)
    print("attention of one step (every layer):", {k: f"{v:.3g}" for k, v in report["attention"].items()}, flush=True)
    report["load_average"] = os.getloadavg()[0]
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
