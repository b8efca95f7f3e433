"""The systems bench/bench_lm_serve.py compares, as one interface: `cell(prompts, new_tokens)` runs one request
per prompt at once and returns `summary()`'s figures plus `outputs` (each stream's text), `close()` ends it.

- `PipeServe`: `pipe serve` on 127.0.0.1 (onnxruntime, `--threads` intra-op threads, continuous batching
  with `--max-sequences` 16), optionally a `--variant`; each stream an SSE `/v1/completions` request from its
  own thread, timed at the client.
- `Transformers`: `AutoModelForCausalLM.generate(do_sample=False)` in this process, the requests of a cell
  served one at a time in arrival order (the simple server a user writes: a lock around generate), tokens
  timed by a streamer; a request's time to first token includes its wait for those before it. It runs
  `requests` of them for real and derives larger cells from them (`queued`), marked so.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def sse(url: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The JSON chunks (`data: {...}` lines) of one streamed POST to `url`; a RuntimeError for another status
    than 200. The standard library's http.client reads them: the client shares this machine's cores with the
    server it times, and with httpx's line iterator this process took 1.0 s of CPU in a cell of 16 streams of
    128 tokens against pipe serve (4% of the two cores' time), with this 0.10-0.16 s."""
    from http.client import HTTPConnection
    from urllib.parse import urlsplit

    where = urlsplit(url)
    connection = HTTPConnection(where.hostname or "127.0.0.1", where.port, timeout=600)
    try:
        connection.request("POST", where.path, json.dumps(body), {"Content-Type": "application/json"})
        answer = connection.getresponse()
        if answer.status != 200:
            raise RuntimeError(f"{url} answered {answer.status}: {answer.read()[:500]!r}")
        for line in answer:
            if line.startswith(b"data: {"):
                yield json.loads(line[6:])
    finally:
        connection.close()


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": float("nan"), "p95": float("nan")}
    return {"p50": float(np.percentile(values, 50)), "p95": float(np.percentile(values, 95))}


def summary(requests: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    """A cell's figures from its requests ({ttft, gaps, tokens}) and its wall time."""
    tokens = sum(r["tokens"] for r in requests)
    gaps = [g for r in requests for g in r["gaps"]]
    return {"streams": len(requests), "tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall,
            "ttft_s": percentiles([r["ttft"] for r in requests]), "per_token_s": percentiles(gaps),
            "short_streams": sum(r["tokens"] == 0 for r in requests)}  # fmt: skip


def run_all(prompts: list[list[int]], one: Callable[[list[int]], dict[str, Any]]) -> tuple[list[dict[str, Any]], float]:
    """Every prompt's request at once, each from its own thread: their records, in order, and the wall time.
    A request that raised raises here, in the caller's thread."""
    results: list[dict[str, Any]] = [{} for _ in prompts]
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = one(prompts[i])
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    if errors:
        raise errors[0]
    return results, wall


def concurrent(prompts: list[list[int]], one: Callable[[list[int]], dict[str, Any]]) -> dict[str, Any]:
    """`run_all`'s cell: its summary and each stream's output."""
    results, wall = run_all(prompts, one)
    cell = summary(results, wall)
    cell["outputs"] = [r["text"] for r in results]
    return cell


class PipeServe:
    """`pipe serve REPOSITORY` with `threads` onnxruntime threads, serving `variant` (None: model.onnx)."""

    def __init__(self, repository: Path, model: str, threads: int, log: Path, variant: str | None = None,
                 extra: tuple[str, ...] = ()) -> None:  # fmt: skip
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        command = [sys.executable, "-m", "pipeline", "serve", str(repository), "--port", str(port), "--poll", "0",
                   "--drain-seconds", "0", "--intra-op-threads", str(threads), "--inter-op-threads", "1",
                   "--max-sequences", "16", "--kv-cache-mb", "1024"]  # fmt: skip
        if variant:
            command += ["--variant", variant]
        command += extra
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads)}
        self.model = model
        self.proc = subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)
        self.url = f"http://127.0.0.1:{port}"
        import httpx

        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/v2/health/ready", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None:
                raise SystemExit(f"pipe serve exited:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        self.close()
        raise SystemExit("pipe serve was not ready in 300 s")

    def stream(self, prompt: list[int], new_tokens: int) -> dict[str, Any]:
        body = {"model": self.model, "prompt": prompt, "max_tokens": new_tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        sent = time.perf_counter()
        times, text, tokens = [], [], 0
        for chunk in sse(f"{self.url}/v1/completions", body):
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            elif chunk["choices"] and chunk["choices"][0]["text"]:
                times.append(time.perf_counter())
                text.append(chunk["choices"][0]["text"])
        ttft = times[0] - sent if times else float("nan")
        return {"ttft": ttft, "gaps": list(np.diff(times)), "tokens": tokens, "text": "".join(text).strip()}

    def cell(self, prompts: list[list[int]], new_tokens: int) -> dict[str, Any]:
        return concurrent(prompts, lambda p: self.stream(p, new_tokens))

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


class _Stamps:
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


class Transformers:
    """transformers' generate on the source directory, one request at a time, `threads` torch threads."""

    def __init__(self, source: Path, threads: int, eos: int, requests: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        self.model = AutoModelForCausalLM.from_pretrained(source, attn_implementation="eager").eval()
        self.eos, self.requests = eos, requests
        self.measured: dict[int, dict[str, Any]] = {}  # by new tokens

    def run(self, prompts: list[list[int]], new_tokens: int) -> dict[str, Any]:
        """The prompts served one after another, all arrived at the start."""
        import torch
        from transformers import GenerationConfig

        config = GenerationConfig(do_sample=False, max_new_tokens=new_tokens, eos_token_id=self.eos, pad_token_id=0)
        arrived = time.perf_counter()
        results = []
        for prompt in prompts:
            stamps = _Stamps()
            ids = torch.tensor([prompt])
            with torch.no_grad():
                out = self.model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config,
                                          streamer=stamps)  # fmt: skip
            made = out[0, len(prompt) :].tolist()
            results.append({"ttft": stamps.times[0] - arrived, "gaps": list(np.diff(stamps.times)),
                            "tokens": len(made), "text": " ".join(f"w{i}" for i in made if i != self.eos)})  # fmt: skip
        cell = summary(results, time.perf_counter() - arrived)
        cell["outputs"] = [r["text"] for r in results]
        return cell

    def cell(self, prompts: list[list[int]], new_tokens: int) -> dict[str, Any]:
        """Up to `requests` prompts really run (once per `new_tokens`, then reused); the rest of the cell derived
        from them. One prompt alone is simply run."""
        if len(prompts) == 1 and self.requests > 1:
            return self.run(prompts, new_tokens)
        if new_tokens not in self.measured:
            self.measured[new_tokens] = self.run(prompts[: self.requests], new_tokens)
        return queued(self.measured[new_tokens], len(prompts))

    def close(self) -> None:
        pass


def queued(measured: dict[str, Any], streams: int) -> dict[str, Any]:
    """A one-at-a-time server's cell of `streams` requests arriving at once, from the requests measured alone:
    the same tokens/s and per-token times; request k's first token after k mean durations plus its own."""
    duration = measured["wall_s"] / measured["streams"]
    first = measured["ttft_s"]["p50"]
    return {"derived_from_requests": measured["streams"], "streams": streams, "tokens_per_s": measured["tokens_per_s"],
            "ttft_s": percentiles([k * duration + first for k in range(streams)]),
            "per_token_s": measured["per_token_s"], "outputs": measured["outputs"][:streams]}  # fmt: skip


class PipeEngine:
    """pipe serve's generation engine in this process, without HTTP: the requests of a cell submitted at once,
    their events read as a handler reads them; times from submission. It separates the engine's cost from
    the server's HTTP, SSE and JSON."""

    def __init__(self, repository: Path, model: str, threads: int) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from pipeline.artifact.directory import Artifact
        from pipeline.serve.generation.served import TextGenerator
        from pipeline.serve.generation.settings import GenerationSettings
        from pipeline.serve.session import ModelSession, SessionOptions

        root = repository / model / "1"
        manifest = Artifact.load(root).manifest
        session = ModelSession(root / "model.onnx", SessionOptions("cpu", threads, 1, True), manifest).session
        settings = GenerationSettings(kv_cache_mb=1024, max_sequences=16)  # as PipeServe starts pipe serve
        made = TextGenerator.of(root, manifest, session, settings, ThreadPoolExecutor(1))
        assert made is not None, f"{root} is not a text-generation model"
        self.generator = made

    def cell(self, prompts: list[list[int]], new_tokens: int) -> dict[str, Any]:
        import asyncio

        from pipeline.serve.generation.sampler import Sampling
        from pipeline.serve.generation.sequence import Job

        async def one(seq: Any, started: float) -> dict[str, Any]:
            times, text = [], []
            while True:
                event = await seq.events.get()
                if event.text:
                    times.append(time.perf_counter())
                    text.append(event.text)
                if event.finish is not None:
                    break
            ttft = times[0] - started if times else float("nan")
            return {"ttft": ttft, "gaps": list(np.diff(times)), "tokens": seq.generated, "text": "".join(text)}

        async def run() -> tuple[list[dict[str, Any]], float]:
            started = time.perf_counter()
            engine = self.generator.engine
            seqs = [engine.submit(Job(p, new_tokens, Sampling(temperature=0))) for p in prompts]
            results = await asyncio.gather(*(one(s, started) for s in seqs))
            return list(results), time.perf_counter() - started

        results, wall = asyncio.run(run())
        cell = summary(results, wall)
        cell["outputs"] = [r["text"] for r in results]
        return cell

    def close(self) -> None:
        pass
