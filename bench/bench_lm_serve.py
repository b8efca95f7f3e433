"""Serving a 135M-class decoder: pipe serve's continuous batching against transformers' `generate` served
one request at a time, at 1, 4 and 16 concurrent streams, side by side in one run.

    .venv/bin/python bench/bench_lm_serve.py [--dir /tmp/lm-serve-bench] [--streams 1 4 16]
        [--prompt-tokens 128] [--new-tokens 128] [--threads 2] [--out bench/results/lm_serve.json]

The model is `bench/lm_serve_model.py`'s (a random-init Llama of SmolLM-135M's shape, imported once
into DIR). Each stream sends its own prompt of `--prompt-tokens` token ids and asks for `--new-tokens`
new tokens, greedy. pipe: `pipe serve` on 127.0.0.1 (onnxruntime with `--threads` intra-op threads,
`--max-sequences` 16), each stream an SSE `/v1/completions` request from its own thread; times are
taken at the client: time to first token (request sent -> first text), time per output token (between
successive streamed pieces), aggregate tokens/s (every stream's tokens / the cell's wall time).
transformers: `AutoModelForCausalLM.generate(do_sample=False)` in this process with `--threads` torch
threads, the requests of a cell served one at a time in arrival order (the simple server a user
writes: a lock around generate), its tokens timed by a streamer; a request's time to first token
includes its wait for the ones before it. transformers runs `--baseline-requests` requests (at 0.5
tokens/s on this loaded machine, 16 x 128 tokens would take over an hour): a cell of c streams
then takes its tokens/s and per-token times from them, and its times to first token from the queue
they make (request k waits k mean durations, then its own first token): derived, and marked so.
Random weights time serving only.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from lm_serve_model import NAME, VOCAB, prepare  # noqa: E402


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": float("nan"), "p95": float("nan")}
    return {"p50": float(np.percentile(values, 50)), "p95": float(np.percentile(values, 95))}


def summary(requests: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    tokens = sum(r["tokens"] for r in requests)
    gaps = [g for r in requests for g in r["gaps"]]
    return {"streams": len(requests), "tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall,
            "ttft_s": percentiles([r["ttft"] for r in requests]), "per_token_s": percentiles(gaps)}  # fmt: skip


# -- pipe serve -----------------------------------------------------------------------------------


def start_pipe(repository: Path, threads: int, log: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "pipeline", "serve", str(repository), "--port", str(port), "--poll", "0",
               "--drain-seconds", "0", "--intra-op-threads", str(threads), "--inter-op-threads", "1",
               "--max-sequences", "16", "--kv-cache-mb", "1024"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    import httpx

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"pipe serve exited:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("pipe serve was not ready in 300 s")


def pipe_stream(url: str, prompt: list[int], new_tokens: int) -> dict[str, Any]:
    import httpx

    body = {"model": NAME, "prompt": prompt, "max_tokens": new_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    sent = time.perf_counter()
    times, text, tokens = [], [], 0
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as answer:
        for line in answer.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            elif chunk["choices"] and chunk["choices"][0]["text"]:
                times.append(time.perf_counter())
                text.append(chunk["choices"][0]["text"])
    return {"ttft": times[0] - sent, "gaps": list(np.diff(times)), "tokens": tokens, "text": "".join(text)}


def pipe_cell(url: str, prompts: list[list[int]], new_tokens: int) -> dict[str, Any]:
    results: list[dict[str, Any]] = [{} for _ in prompts]

    def run(i: int) -> None:
        results[i] = pipe_stream(url, prompts[i], new_tokens)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cell = summary(results, time.perf_counter() - started)
    cell["texts"] = [r["text"] for r in results]
    return cell


# -- transformers, one request at a time ------------------------------------------------------------


class Stamps:
    """A generate streamer that timestamps each new token (its first put() is the prompt)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._prompt = True

    def put(self, value: Any) -> None:
        if self._prompt:
            self._prompt = False
            return
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def transformers_cell(model: Any, prompts: list[list[int]], new_tokens: int) -> dict[str, Any]:
    import torch
    from transformers import GenerationConfig

    config = GenerationConfig(do_sample=False, max_new_tokens=new_tokens, eos_token_id=VOCAB - 1, pad_token_id=0)
    arrived = time.perf_counter()  # every request of the cell arrives at once and waits its turn
    results = []
    for prompt in prompts:
        stamps = Stamps()
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config, streamer=stamps)
        made = out.shape[1] - len(prompt)
        results.append({"ttft": stamps.times[0] - arrived, "gaps": list(np.diff(stamps.times)), "tokens": made,
                        "ids": out[0, len(prompt):].tolist()})  # fmt: skip
    cell = summary(results, time.perf_counter() - arrived)
    cell["ids"] = [r["ids"] for r in results]
    return cell


def queued(measured: dict[str, Any], streams: int) -> dict[str, Any]:
    """A one-at-a-time server's cell of `streams` requests arriving at once, from the requests measured alone:
    the same tokens/s and per-token times; request k's first token after k mean durations plus its own."""
    duration = measured["wall_s"] / measured["streams"]
    first = measured["ttft_s"]["p50"]
    return {"derived_from_requests": measured["streams"], "tokens_per_s": measured["tokens_per_s"],
            "ttft_s": percentiles([k * duration + first for k in range(streams)]),
            "per_token_s": measured["per_token_s"]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/lm-serve-bench"))
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--baseline-requests", type=int, default=1, help="transformers requests really run")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "lm_serve.json")
    args = parser.parse_args()
    source, repository = prepare(args.dir)
    rng = np.random.default_rng(0)
    prompts = [[1, *rng.integers(3, VOCAB - 1, size=args.prompt_tokens - 1).tolist()] for _ in range(max(args.streams))]

    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(source, attn_implementation="eager").eval()
    proc, url = start_pipe(repository, args.threads, args.dir / "serve.log")
    cells: list[dict[str, Any]] = []
    try:
        pipe_cell(url, prompts[:1], 4)  # warm up both
        transformers_cell(model, prompts[:1], 2)
        measured = transformers_cell(model, prompts[: args.baseline_requests], args.new_tokens)
        print(f"transformers, {args.baseline_requests} request(s) one at a time: {measured['tokens_per_s']:.2f} tok/s, "
              f"TTFT p50 {measured['ttft_s']['p50']:.2f} s", flush=True)  # fmt: skip
        for streams in args.streams:
            batch = prompts[:streams]
            pipe = pipe_cell(url, batch, args.new_tokens)
            hf = queued(measured, streams)
            expected = [" ".join(f"w{i}" for i in ids if i != VOCAB - 1) for ids in measured["ids"]]
            same = sum(a.strip() == b.strip() for a, b in zip(pipe.pop("texts"), expected, strict=False))
            cells.append({"streams": streams, "pipe": pipe, "transformers": hf, "same_greedy_text": same,
                          "same_greedy_text_of": min(streams, len(expected)),
                          "ratio_tokens_per_s": pipe["tokens_per_s"] / hf["tokens_per_s"]})  # fmt: skip
            p50 = pipe["ttft_s"]["p50"]
            print(f"{streams:>2} streams: pipe {pipe['tokens_per_s']:.1f} tok/s (TTFT p50 {p50:.3f} s, "
                  f"per token p50 {pipe['per_token_s']['p50'] * 1000:.0f} ms) | transformers {hf['tokens_per_s']:.1f} "
                  f"tok/s (TTFT p50 {hf['ttft_s']['p50']:.3f} s) | x{cells[-1]['ratio_tokens_per_s']:.2f}; "
                  f"greedy text equal to transformers' {same}/{min(streams, len(expected))}", flush=True)  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(30)
    one = next((c for c in cells if c["streams"] == 1), None)
    measured.pop("ids", None)
    result = {
        "model": "random-init Llama, SmolLM-135M shape (134.5 M parameters, vocabulary 49,152)",
        "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens, "threads": args.threads,
        "load_average": os.getloadavg(), "transformers_measured": measured, "cells": cells,
        "pipe_16_over_1": (cells[-1]["pipe"]["tokens_per_s"] / one["pipe"]["tokens_per_s"]) if one else None,
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "cells"}))


if __name__ == "__main__":
    main()
