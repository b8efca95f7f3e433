"""Serving a 135M-class decoder: pipe serve's continuous batching against the servers a user would pick
instead, at 1, 4 and 16 concurrent streams, side by side in one run.

    .venv/bin/python bench/bench_lm_serve.py [--dir /tmp/lm-serve-bench] [--streams 1 4 16]
        [--prompt-tokens 128] [--new-tokens 128] [--threads 2] [--systems pipe pipe:int4-weights transformers ...]
        [--out bench/results/lm_serve.json]

The model is `bench/lm_serve_model.py`'s (a random-init Llama of SmolLM-135M's shape imported once into DIR,
its int8- and int4-weights variants made by `pipe optimize`). Each stream sends its own prompt of
`--prompt-tokens` token ids and asks for `--new-tokens` new tokens, greedy. Per cell: aggregate tokens/s
(every stream's tokens / the cell's wall time), time to first token (request sent -> first text) and time
per output token (between successive streamed pieces), p50 and p95, all taken at the client.

Repeating a stream count (`--streams 1 16 1 16 1 16`) runs rounds: the table then ends with each system's
median cell (by tokens/s; of an even count the lower middle one) per stream count, every round's tokens/s
beside it.

Systems (`--systems`; each is started once, then the cells run stream count by stream count, every system
in turn, so each comparison is from one window of this shared machine; a stream count's next round starts
one system later, so that no system always runs first, or always after the same one):
- `pipe`, `pipe:VARIANT`: `pipe serve` (bench/lm_serve_clients.py), model.onnx or a variant;
- `pipe-engine`: pipe serve's generation engine in this process, without HTTP (not in the defaults);
- `transformers`: `generate` served one request at a time (lm_serve_clients.py), `--baseline-requests`
  really run and larger cells derived from them (marked `derived_from_requests`);
- `llama.cpp:QUANT` (F32, Q8_0, Q4_1): llama.cpp's own server on a GGUF of the same weights
  (bench/peer_llamacpp.py, installed outside the tree as its docstring says);
- `genai`: onnxruntime-genai's generator on the same model.onnx (bench/peer_genai.py, likewise).
A system whose peer is not installed is skipped with a line saying why. Random weights time serving only.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from lm_serve_clients import PipeEngine, PipeServe, Transformers  # noqa: E402
from lm_serve_model import NAME, VOCAB, prepare  # noqa: E402

DEFAULT_SYSTEMS = [
    "pipe",
    "pipe:int8-weights",
    "pipe:int4-weights",
    "transformers",
    "llama.cpp:F32",
    "llama.cpp:Q8_0",
    "llama.cpp:Q4_1",
    "genai",
    "genai:builder",
]


def as_ids(output: str | list[int]) -> list[int]:
    """A stream's output as token ids: the bench tokenizer's words (`w123`) read back, so that outputs compare
    across systems whether they answer text or ids."""
    if not isinstance(output, str):
        return [int(i) for i in output]
    return [int(w[1:]) for w in output.split() if w[:1] == "w" and w[1:].isdigit()]


def start(system: str, args: argparse.Namespace, source: Path, repository: Path) -> Any:
    """The system's client, started; None (with a line why) when its peer is not installed here."""
    kind, _, option = system.partition(":")
    log = args.dir / f"{system.replace(':', '-')}.log"
    if kind == "pipe":
        return PipeServe(repository, NAME, args.threads, log, option or None)
    if kind == "pipe-engine":
        return PipeEngine(repository, NAME, args.threads)
    if kind == "transformers":
        return Transformers(source, args.threads, VOCAB - 1, args.baseline_requests)
    peers = {"llama.cpp": "peer_llamacpp", "genai": "peer_genai"}
    if kind not in peers:
        raise SystemExit(f"unknown system {system!r}: pipe[:VARIANT], pipe-engine, transformers, llama.cpp:Q, genai")
    module = importlib.import_module(peers[kind])
    missing = module.missing()
    if missing:
        print(f"{system}: skipped ({missing})", flush=True)
        return None
    return module.Peer(source, repository, args.threads, log, option or None)


def row(system: str, cell: dict[str, Any]) -> str:
    ttft, gap = cell["ttft_s"], cell["per_token_s"]
    derived = " (derived)" if "derived_from_requests" in cell else ""
    return (f"| {system} | {cell['tokens_per_s']:,.1f} | {ttft['p50']:.2f} / {ttft['p95']:.2f}{derived} | "
            f"{gap['p50'] * 1e3:,.0f} / {gap['p95'] * 1e3:,.0f} | {cell.get('same_as_alone', '-')} |")  # fmt: skip


def medians(cells: list[dict[str, Any]]) -> list[str]:
    """Table rows of each system's median cell per stream count, when `--streams` repeats one (`1 16 1 16 1 16`:
    rounds, each system in turn within each, so that a comparison rests on more than one window of this shared
    machine); none otherwise."""
    rounds: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for cell in cells:
        rounds.setdefault((cell["streams"], cell["system"]), []).append(cell)
    if all(len(c) == 1 for c in rounds.values()):
        return []
    lines, header = [], 0
    for (streams, system), repeated in sorted(rounds.items(), key=lambda kv: kv[0][0]):
        if streams != header:
            header = streams
            middle = "median" if len(repeated) % 2 else "lower middle"
            lines.append(f"| **{streams} stream{'s' * (streams > 1)}, {middle} of {len(repeated)}** | | | | |")
        median = sorted(repeated, key=lambda c: c["tokens_per_s"])[(len(repeated) - 1) // 2]
        spread = ", ".join(f"{c['tokens_per_s']:.1f}" for c in repeated)
        lines.append(row(system, median).replace(f"| {system} |", f"| {system} ({spread}) |", 1))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/lm-serve-bench"))
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--systems", nargs="+", default=DEFAULT_SYSTEMS)
    parser.add_argument("--baseline-requests", type=int, default=2, help="transformers requests really run")
    parser.add_argument("--alone", type=int, default=4, help="prompts each system also answers one at a time")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "lm_serve.json")
    args = parser.parse_args()
    source, repository = prepare(args.dir)
    rng = np.random.default_rng(0)
    prompts = [[1, *rng.integers(3, VOCAB - 1, size=args.prompt_tokens - 1).tolist()] for _ in range(max(args.streams))]
    systems = {name: client for name in args.systems if (client := start(name, args, source, repository))}
    alone: dict[str, list[list[int]]] = {}  # each system's answers to the first --alone prompts, one at a time
    cells: list[dict[str, Any]] = []
    lines = ["| system | tokens/s | TTFT p50 / p95 s | per token p50 / p95 ms | streams equal to alone |",
             "| --- | ---: | --- | --- | --- |"]  # fmt: skip
    try:
        for name, client in systems.items():
            client.cell(prompts[:1], 4)  # warm up
            if name != "transformers":
                answers = [client.cell([p], args.new_tokens)["outputs"][0] for p in prompts[: args.alone]]
                alone[name] = [as_ids(o) for o in answers]
        for turn, streams in enumerate(args.streams):
            lines.append(f"| **{streams} stream{'s' * (streams > 1)}** | | | | |")
            shift = args.streams[:turn].count(streams) % len(systems)  # this stream count's round, 0 first
            order = list(systems.items())
            for name, client in order[shift:] + order[:shift]:
                cell = client.cell(prompts[:streams], args.new_tokens)
                outputs = [as_ids(o) for o in cell.pop("outputs")]
                if streams > 1 and alone.get(name):
                    same = sum(a == b for a, b in zip(outputs, alone[name], strict=False))
                    cell["same_as_alone"] = f"{same}/{min(len(outputs), len(alone[name]))}"
                cell["first_ids"] = outputs[0][:8] if outputs else []
                cell["load_average"] = os.getloadavg()[0]
                cells.append({"system": name, **cell})
                lines.append(row(name, cell))
                print(lines[-1], f"load {cell['load_average']:.1f}", flush=True)
    finally:
        for client in systems.values():
            client.close()
    lines += medians(cells)
    firsts = {c["system"]: c["first_ids"] for c in cells if c["streams"] == 1}
    result = {
        "model": "random-init Llama, SmolLM-135M shape (134.5 M parameters, vocabulary 49,152)",
        "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens, "threads": args.threads,
        "cpu": os.cpu_count(), "cells": cells, "table": lines,
        "same_first_stream_as_pipe": {k: v == firsts.get("pipe") for k, v in firsts.items()},
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
