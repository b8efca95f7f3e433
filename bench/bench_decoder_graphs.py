"""A decoder's graphs side by side: traced with transformers' eager attention, traced grouped
(pipeline/export/grouped_attention.py), and written with onnxruntime's fused kernels (the one pipe exports
for Llama, pipeline/export/fused_decoder.py), each also with int4 weights: decode steps timed in turn.

    .venv/bin/python bench/bench_decoder_graphs.py [--dir /tmp/lm-serve-bench] [--batches 1 16]
        [--past 128] [--steps 24] [--rounds 3] [--threads 2] [--out bench/results/decoder_graphs.json]

The model is bench/lm_serve_model.py's (a random Llama of SmolLM-135M's shape: 9 query heads on 3 KV heads),
or with `--family` a random model of another family the writer writes at that shape (`--layers` fewer to
export faster; Qwen3's query and key norms drawn from U(0.5, 1.5), not ones), saved under DIR/FAMILY:

    .venv/bin/python bench/bench_decoder_graphs.py --family qwen3 --layers 8 --out /tmp/qwen3_graphs.json

Every graph is made from it by pipe's own export (`export_decoder`, its switches set) and, for the int4
ones, pipe's int4-weights conversion at its defaults (block 32, accuracy level 4); each round times
`--steps` decode steps of each graph in turn after a `--past`-token prefill, feeding each step's presents
back as the next past (as pipe serve's hot path does). Reported: the median step of each graph over the
rounds, each graph's step over the written one's (same weights), and whether the fp32 graphs' greedy
tokens agree.
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

from lm_serve_model import VOCAB, prepare  # noqa: E402

GRAPHS = {"eager": {"fused": False, "grouped": False}, "grouped": {"fused": False}, "fused": {}}  # export switches
INT4 = ("grouped", "fused")  # also timed with int4 weights


def export_all(source: Path, directory: Path) -> dict[str, Path]:
    """Every graph of the source model (GRAPHS, then INT4's as NAME-int4), made once."""
    paths = {name: directory / f"{name}.onnx" for name in GRAPHS} | {
        f"{n}-int4": directory / f"{n}-int4.onnx" for n in INT4
    }
    if all(p.exists() for p in paths.values()):
        return paths
    import torch
    from transformers import AutoModelForCausalLM

    from pipeline.export.lm_module import export_decoder
    from pipeline.optimize.weight_only import WeightSettings, quantize_weights
    from pipeline.runtime.decoder import CachedDecoder, cache_layout

    torch.set_num_threads(2)
    model = AutoModelForCausalLM.from_pretrained(source, attn_implementation="eager").eval()
    decoder = CachedDecoder(model).eval()
    directory.mkdir(parents=True, exist_ok=True)
    for name, switches in GRAPHS.items():
        export_decoder(decoder, cache_layout(decoder), paths[name], 18, **switches)
    int4 = WeightSettings(bits=4, block_size=32, symmetric=True, accuracy_level=4, embeddings=False)
    for name in INT4:
        quantize_weights(paths[name], paths[f"{name}-int4"], int4)
    return paths


FAMILIES = ("llama", "mistral", "phi3", "qwen2", "qwen3")  # --family: a config class each, below


def family_source(directory: Path, family: str, layers: int) -> Path:
    """A random `family` model of the Llama's shape (bench/lm_serve_model.py) saved in `directory`, once."""
    if (directory / "config.json").exists():
        return directory
    import torch
    import transformers

    config_class = {"llama": "LlamaConfig", "mistral": "MistralConfig", "phi3": "Phi3Config", "qwen2": "Qwen2Config",
                    "qwen3": "Qwen3Config"}[family]  # fmt: skip
    config = getattr(transformers, config_class)(
        vocab_size=VOCAB, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers, num_attention_heads=9,
        num_key_value_heads=3, head_dim=64, max_position_embeddings=2048, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    from tests.lm.lm_models import random_head_norms

    random_head_norms(model)
    model.save_pretrained(directory)
    return directory


def decode(session: Any, batch: int, past: int, steps: int) -> tuple[list[float], np.ndarray]:
    """Step times after a prefill of `past` tokens, and the greedy tokens."""
    names = [i.name for i in session.get_inputs() if i.name.startswith("past_key_values")]
    outputs = [o.name for o in session.get_outputs()]
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(3, VOCAB - 1, (batch, past)), "attention_mask": np.ones((batch, past), np.int64),
             "position_ids": np.tile(np.arange(past), (batch, 1))}  # fmt: skip
    feeds.update({n: np.zeros((batch, 3, 0, 64), np.float32) for n in names})
    out = session.run(outputs, feeds)
    times, tokens, length = [], [], past
    for _ in range(steps):
        token = np.argmax(out[0][:, -1], axis=-1)
        tokens.append(token)
        feeds = {"input_ids": token[:, None].astype(np.int64), "attention_mask": np.ones((batch, length + 1), np.int64),
                 "position_ids": np.full((batch, 1), length, np.int64)}  # fmt: skip
        feeds.update(zip(names, out[1:], strict=True))
        started = time.perf_counter()
        out = session.run(outputs, feeds)
        times.append(time.perf_counter() - started)
        length += 1
    return times[2:], np.stack(tokens, axis=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/lm-serve-bench"))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--past", type=int, default=128)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "decoder_graphs.json")
    parser.add_argument("--family", choices=FAMILIES, help="a random model of this family (default: the served Llama)")
    parser.add_argument("--layers", type=int, default=30, help="with --family: its layers")
    args = parser.parse_args()
    if args.family is None:
        source, graphs = prepare(args.dir)[0], args.dir / "graphs"
    else:
        named = args.dir / f"{args.family}-{args.layers}"
        source, graphs = family_source(named / "source", args.family, args.layers), named / "graphs"
    paths = export_all(source, graphs)
    from pipeline.runtime.session import create_session

    sessions = {name: create_session(path, "cpu", args.threads, 1, True) for name, path in paths.items()}
    rows = []
    for batch in args.batches:
        steps: dict[str, list[float]] = {name: [] for name in sessions}
        tokens: dict[str, np.ndarray] = {}
        for _ in range(args.rounds):
            for name, session in sessions.items():
                times, tokens[name] = decode(session, batch, args.past, args.steps)
                steps[name] += times
        median = {name: float(np.median(t)) for name, t in steps.items()}
        over = {name: median[name] / median["fused" if "int4" not in name else "fused-int4"] for name in median}
        row = {"batch": batch, "past": args.past, "step_ms": {k: v * 1e3 for k, v in median.items()},
               "tokens_per_s": {k: batch / v for k, v in median.items()}, "over_fused": over,
               "same_greedy_tokens": all(np.array_equal(tokens[n], tokens["fused"]) for n in GRAPHS),
               "load_average": os.getloadavg()[0]}  # fmt: skip
        rows.append(row)
        cells = ", ".join(f"{name} {ms:.1f} ms (x{over[name]:.2f})" for name, ms in row["step_ms"].items())
        print(f"batch {batch}: {cells}; fp32 greedy tokens agree: {row['same_greedy_tokens']} "
              f"(load {row['load_average']:.1f})", flush=True)  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    made = {"family": args.family, "layers": args.layers} if args.family else {}
    args.out.write_text(json.dumps({"threads": args.threads, **made, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
