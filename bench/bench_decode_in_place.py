"""Decoding in place, three ways, raw onnxruntime loops side by side: each keeps the running rows' cache in one
buffer and appends to it, never concatenating the cache into presents a step.

    .venv/bin/python bench/bench_decode_in_place.py [--dir /tmp/lm-serve-bench] [--batches 1 4 16]
        [--past 128] [--steps 64] [--rounds 4] [--threads 2] [--out bench/results/decode_in_place.json]

- `grouped`: pipe's written graph (the imported artifact's model.onnx) fed `present_new_only`, its pasts
  views of one array, the new column copied in after each call (pipe serve's decode before `decode_in_place`);
- `in_place`: the same graph fed `decode_in_place`, each present bound to its past's memory (IOBinding), so
  its GroupQueryAttention writes the new column itself, through an If a layer;
- `pinned`: the same graph with `decode_in_place` a constant True, so that onnxruntime drops the Ifs (pipe
  serve's session: serve/session.py), bound the same way; its prefill too writes into the buffers;
- `builder`: onnxruntime-genai's model builder's graph of the same weights (GroupQueryAttention, past and
  present bound to one buffer, as onnxruntime-genai runs it; skipped when bench/peer_genai.py's builder
  venv is not made).
The model is bench/lm_serve_model.py's (a random Llama of SmolLM-135M's shape). Each round prefills `--past`
tokens a row and times `--steps` greedy steps of each way in turn (buffers `--past` + `--steps` wide), each
round starting one way later than the last. Reported: each way's median step over the rounds, over
`in_place`'s, and whether the greedy tokens agree.

At one row, beside them in each round, `blas`: numpy's BLAS (on every core) multiplying a hidden state by a
matrix of as many fp32 weights as the graph's MatMuls hold (537.9 MB on this model), `--steps` times: a
matrix-vector product, bound by how fast memory delivers the weights, which no graph at fp32 reads in fewer
bytes. It is the step without attention, norms or Python, with one product for 151: the floor of a step at
one row. (With more rows it is no floor: numpy's product of 4 rows by one tall matrix took twice as long as
a whole step of the graph, whose MatMuls onnxruntime runs on weights it packed at load.)
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

from lm_serve_model import NAME, VOCAB, prepare  # noqa: E402


def bound(session: Any, feeds: dict[str, np.ndarray], buffers: dict[str, np.ndarray]) -> np.ndarray:
    """One call with `buffers` (past name -> array) bound as the pasts and as their presents; the logits."""
    from onnxruntime import OrtValue

    binding = session.io_binding()
    for name, value in feeds.items():
        binding.bind_ortvalue_input(name, OrtValue.ortvalue_from_numpy(value))
    for name, buffer in buffers.items():
        value = OrtValue.ortvalue_from_numpy(buffer)
        binding.bind_ortvalue_input(name, value)
        binding.bind_ortvalue_output(name.replace("past_key_values", "present"), value)
    binding.bind_output("logits")
    session.run_with_iobinding(binding)
    return binding.get_outputs()[-1].numpy()


def decode(way: str, session: Any, batch: int, past: int, steps: int) -> tuple[list[float], np.ndarray]:
    """Step times of one way after a prefill of `past` tokens a row, and the greedy tokens."""
    names = [i.name for i in session.get_inputs() if i.name.startswith("past_key_values")]
    width = past + steps
    ids = np.random.default_rng(0).integers(3, VOCAB - 1, (batch, past))
    cache = np.zeros((len(names), batch, 3, width, 64), np.float32)  # every layer's keys and values, one array
    buffers = dict(zip(names, cache, strict=True))  # each past's view of it
    new_only = {"present_new_only": np.array(True)}
    if way == "builder":  # its prefill writes into the buffers; it takes no position_ids
        logits = bound(session, {"input_ids": ids, "attention_mask": np.ones((batch, past), np.int64)}, buffers)
    elif way == "pinned":  # likewise (one prompt length: one call, as pipe serve's prefill in place)
        feeds = {"input_ids": ids, "attention_mask": np.ones((batch, past), np.int64), "logits_from": np.array(-1),
                 "position_ids": np.tile(np.arange(past), (batch, 1))}  # fmt: skip
        logits = bound(session, feeds, buffers)
    else:
        feeds = {"input_ids": ids, "attention_mask": np.ones((batch, past), np.int64), "logits_from": np.array(-1),
                 "position_ids": np.tile(np.arange(past), (batch, 1)), **new_only}  # fmt: skip
        out = session.run(None, {**feeds, **{n: np.zeros((batch, 3, 0, 64), np.float32) for n in names}})
        cache[:, :, :, :past] = np.stack(out[1:])
        logits = out[0]
    times, tokens = [], []
    for length in range(past, width):
        token = np.argmax(logits[:, -1], axis=-1)
        tokens.append(token)
        mask = np.concatenate([np.tile(np.arange(width) < length, (batch, 1)), np.ones((batch, 1), bool)], axis=1)
        started = time.perf_counter()
        if way == "builder":
            feeds = {"input_ids": token[:, None], "attention_mask": np.ones((batch, length + 1), np.int64)}
            logits = bound(session, feeds, buffers)
        else:
            feeds = {"input_ids": token[:, None], "attention_mask": mask.astype(np.int64),
                     "position_ids": np.full((batch, 1), length, np.int64)}  # fmt: skip
            if way in ("in_place", "pinned"):
                flag = {"decode_in_place": np.array(True)} if way == "in_place" else {}
                logits = bound(session, {**feeds, **flag}, dict(zip(names, cache, strict=True)))
            else:
                out = session.run(
                    None, {**feeds, "present_new_only": np.array(True), **dict(zip(names, cache, strict=True))}
                )
                cache[:, :, :, length] = np.stack(out[1:])[:, :, :, -1]
                logits = out[0]
        times.append(time.perf_counter() - started)
    return times[2:], np.stack(tokens, axis=1)


def matmul_weights(path: Path) -> int:
    """How many weights the graph's MatMuls read (the initializers they take), the embedding's Gather aside."""
    import onnx

    graph = onnx.load(str(path)).graph
    sizes = {i.name: int(np.prod(i.dims)) for i in graph.initializer}
    return sum(sizes.get(name, 0) for node in graph.node if node.op_type == "MatMul" for name in node.input)


def blas(weights: np.ndarray, steps: int) -> list[float]:
    """Times of `steps` products of one hidden state by `weights` (`blas` in the module doc)."""
    state = np.ones(weights.shape[1], np.float32)
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        weights @ state
        times.append(time.perf_counter() - started)
    return times[2:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/lm-serve-bench"))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--past", type=int, default=128)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "decode_in_place.json")
    args = parser.parse_args()
    source, repository = prepare(args.dir)
    import peer_genai

    from pipeline.runtime.session import create_session

    graphs = {way: repository / NAME / "1" / "model.onnx" for way in ("grouped", "in_place", "pinned")}
    if missing := peer_genai.missing(peer_genai.BUILDER_VENV):
        print(f"builder: skipped ({missing})", flush=True)
    else:
        graphs["builder"] = peer_genai.build(source) / "model.onnx"
    pinned = {"decode_in_place": np.array(True)}  # as pipe serve makes its session (serve/session.py)
    sessions = {way: create_session(path, "cpu", args.threads, 1, True, constants=pinned if way == "pinned" else None)
                for way, path in graphs.items()}  # fmt: skip
    hidden = 576  # bench/lm_serve_model.py's
    floor_rows = matmul_weights(graphs["pinned"]) // hidden if 1 in args.batches else 0  # timed at one row only
    weights = np.full((floor_rows, hidden), 0.01, np.float32)
    rows = []
    for batch in args.batches:
        steps: dict[str, list[float]] = {way: [] for way in sessions}
        if batch == 1:
            steps["blas"] = []
        tokens: dict[str, np.ndarray] = {}
        order = list(sessions.items())
        for turn in range(args.rounds):
            shift = turn % len(order)
            for way, session in order[shift:] + order[:shift]:
                times, tokens[way] = decode(way, session, batch, args.past, args.steps)
                steps[way] += times
            if batch == 1:
                steps["blas"] += blas(weights, args.steps)
        median = {way: float(np.median(t)) * 1e3 for way, t in steps.items()}
        row = {"batch": batch, "past": args.past, "step_ms": median,
               "over_in_place": {way: ms / median["in_place"] for way, ms in median.items()},
               "same_greedy_tokens": {way: bool(np.array_equal(t, tokens["in_place"])) for way, t in tokens.items()},
               "load_average": os.getloadavg()[0]}  # fmt: skip
        rows.append(row)
        cells = ", ".join(f"{way} {ms:.1f} ms (x{row['over_in_place'][way]:.2f})" for way, ms in median.items())
        print(f"batch {batch}: {cells}; greedy tokens as in_place: {row['same_greedy_tokens']} "
              f"(load {row['load_average']:.1f})", flush=True)  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {"threads": args.threads, "steps": args.steps, "blas_weights_mb": weights.nbytes / 1e6, "rows": rows}
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
