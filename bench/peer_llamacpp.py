"""llama.cpp's own server (`llama-server`) as a peer of pipe serve in bench/bench_lm_serve.py: the same
random 135M-shaped Llama as GGUF (F32, Q8_0 or Q4_1), continuous batching over 16 slots.

Which llama.cpp server: llama-cpp-python's `llama_cpp.server` serves one request at a time (one
`Llama` behind a lock in llama_cpp/server/app.py, no batching across requests), and with its default
`interrupt_requests=True` a streaming answer is ended (`[DONE]`) as soon as another request waits: the
streams without text that issue 30 saw at 4 and 16 streams. llama.cpp's own `llama-server` decodes
every running slot in one batch each step (`--parallel` slots, `--cont-batching`, on by default): the
one a user picks to serve many streams, and the one measured here. Its source comes from PyPI inside
llama-cpp-python's sdist (vendor/llama.cpp), built with cmake.

Install (outside the repository, in PEER = /work/peers/llamacpp or $LLAMACPP_PEER; `python
bench/peer_llamacpp.py install` runs these steps; the build took 16 minutes, 12.5 CPU-minutes, on
this shared 2-core machine):

    python3 -m pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d PEER/dl
    tar xzf PEER/dl/llama_cpp_python-0.3.36.tar.gz -C PEER
    cmake -S PEER/llama_cpp_python-0.3.36/vendor/llama.cpp -B PEER/build -DCMAKE_BUILD_TYPE=Release \\
        -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF \\
        -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \\
        -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF
    nice -n 10 cmake --build PEER/build -j2 --target llama-server llama-quantize

(AVX2 without AVX-512, as issue 30 found: its native build segfaulted here; no web UI, which would be
downloaded.) The GGUFs are made on first use (`gguf()`): F32 by the vendored convert_hf_to_gguf.py,
run with this interpreter (it needs torch and transformers, which the bench has) and the vendored
gguf-py, its vocabulary written here because the bench's word-level tokenizer is none it knows (id i
is the SentencePiece-style piece `▁w{i}`, so ids stay identical and a token's text is ` w{i}`);
Q8_0 and Q4_1 by llama.cpp's `llama-quantize` from the F32 file.

Requests: each stream a streamed OpenAI `/v1/completions` of its prompt as token ids, greedy
(temperature 0, top_k 1, no repeat penalty), `max_tokens` new tokens with `ignore_eos` (every stream
runs to its length) and `cache_prompt` false (every prompt is prefilled, as in pipe). Times are taken
at the client as bench_lm_serve.pipe_stream takes them.

    .venv/bin/python bench/peer_llamacpp.py [--weights F32 Q8_0 Q4_1] [--streams 1 4 16]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from lm_serve_clients import concurrent, run_all, summary  # noqa: E402
from lm_serve_model import NAME, VOCAB  # noqa: E402

PEER = Path(os.environ.get("LLAMACPP_PEER", "/work/peers/llamacpp"))
VERSION = "0.3.36"  # llama-cpp-python's sdist, whose vendor/llama.cpp is built
WEIGHTS = ("F32", "Q8_0", "Q4_1")
CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON",
    "-DGGML_F16C=ON", "-DGGML_AVX512=OFF", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_OPENSSL=OFF", "-DBUILD_SHARED_LIBS=OFF",
]  # fmt: skip
# Greedy and repeatable: temperature 0 picks the argmax; top_k 1 and no penalties leave nothing else to
# sample; ignore_eos runs every stream to max_tokens; no prompt cache, so each prompt is prefilled.
GREEDY = {"temperature": 0, "top_k": 1, "top_p": 1.0, "min_p": 0.0, "repeat_penalty": 1.0, "repeat_last_n": 0,
          "seed": 0, "ignore_eos": True, "cache_prompt": False}  # fmt: skip


def vendor(peer: Path = PEER) -> Path:
    return peer / f"llama_cpp_python-{VERSION}" / "vendor" / "llama.cpp"


def binary(name: str, peer: Path = PEER) -> Path:
    return peer / "build" / "bin" / name


def install(peer: Path = PEER) -> None:
    """Download llama-cpp-python's sdist from PyPI and build llama.cpp's server and quantizer from it."""
    peer.mkdir(parents=True, exist_ok=True)
    sdist = peer / "dl" / f"llama_cpp_python-{VERSION}.tar.gz"
    if not sdist.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={VERSION}", "-d", str(peer / "dl")], check=True)  # fmt: skip
    if not vendor(peer).exists():
        subprocess.run(["tar", "xzf", str(sdist), "-C", str(peer)], check=True)
    subprocess.run(["cmake", "-S", str(vendor(peer)), "-B", str(peer / "build"), *CMAKE_FLAGS], check=True)
    subprocess.run(["nice", "-n", "10", "cmake", "--build", str(peer / "build"), "-j2", "--target", "llama-server",
                    "llama-quantize"], check=True)  # fmt: skip


# Run in a child with the vendored converter on its path: the bench's word-level vocabulary written as a
# SentencePiece-style one (ids unchanged; <pad> <s> </s> control tokens, id i >= 3 the piece "▁w{i}").
_CONVERT = r"""
import json, sys
from pathlib import Path
vendor, source, out = sys.argv[1:4]
sys.path[:0] = [vendor, vendor + "/gguf-py"]
import gguf
import convert_hf_to_gguf
from conversion.llama import LlamaModel

def set_vocab(self):
    vocab = json.loads((self.dir_model / "tokenizer.json").read_text())["model"]["vocab"]
    words = {i: w for w, i in vocab.items()}
    n = self.hparams["vocab_size"]
    assert sorted(words) == list(range(n)), "the tokenizer must name every id"
    control = {0, 1, 2}
    self.gguf_writer.add_tokenizer_model("llama")
    self.gguf_writer.add_tokenizer_pre("default")
    self.gguf_writer.add_token_list([words[i] if i in control else "\u2581" + words[i] for i in range(n)])
    self.gguf_writer.add_token_scores([0.0] * n)
    self.gguf_writer.add_token_types([gguf.TokenType.CONTROL if i in control else gguf.TokenType.NORMAL
                                      for i in range(n)])
    self.gguf_writer.add_bos_token_id(self.hparams["bos_token_id"])
    self.gguf_writer.add_eos_token_id(self.hparams["eos_token_id"])
    self.gguf_writer.add_pad_token_id(self.hparams["pad_token_id"])
    self.gguf_writer.add_add_bos_token(True)
    self.gguf_writer.add_add_eos_token(False)
    template = self.dir_model / "chat_template.jinja"
    if template.exists():
        self.gguf_writer.add_chat_template(template.read_text())

LlamaModel.set_vocab = set_vocab
sys.argv = ["convert_hf_to_gguf.py", source, "--outfile", out, "--outtype", "f32"]
convert_hf_to_gguf.main()
"""


def gguf(source: Path, weights: str, peer: Path = PEER) -> Path:
    """The bench model as a GGUF of `weights` (F32, Q8_0 or Q4_1), made when missing."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights {weights!r} is not one of {', '.join(WEIGHTS)}")
    out = peer / "models" / f"{NAME}-{weights}.gguf"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    f32 = peer / "models" / f"{NAME}-F32.gguf"
    if not f32.exists():
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        subprocess.run(["nice", "-n", "10", sys.executable, "-c", _CONVERT, str(vendor(peer)), str(source),
                        str(f32) + ".part"], check=True, env=env)  # fmt: skip
        os.replace(str(f32) + ".part", f32)
    if weights != "F32":
        subprocess.run(["nice", "-n", "10", str(binary("llama-quantize", peer)), str(f32), str(out) + ".part",
                        weights, "2"], check=True)  # fmt: skip
        os.replace(str(out) + ".part", out)
    return out


@dataclass
class Server:
    """A running llama-server: its process, address, the weights it serves and how it was started."""

    proc: subprocess.Popen
    url: str
    weights: str
    command: list[str]
    settings: dict[str, Any] = field(default_factory=dict)


_server: Server | None = None


def start(source: Path = Path("/tmp/lm-serve-bench/source"), weights: str = "Q4_1", threads: int = 2,
          parallel: int = 16, context: int = 512, extra: tuple[str, ...] = (), log: Path | None = None,
          peer: Path = PEER) -> str:  # fmt: skip
    """Serve `weights` with llama-server on 127.0.0.1 as its docs advise for many streams: `parallel`
    slots (`-np`) of `context` tokens each (`-c` parallel x context: the KV cache is split between the
    slots; one unified cache, `-kvu`, was slower here: 85.6 against 108.1 tokens/s at 16 streams of
    Q8_0), continuous batching (`-cb`), `threads` threads for decode and prefill; `extra` flags after
    those. Returns the URL."""
    global _server
    stop()
    _server = launch(source, weights, threads, parallel, context, extra, log, peer)
    return _server.url


def launch(source: Path, weights: str, threads: int = 2, parallel: int = 16, context: int = 512,
           extra: tuple[str, ...] = (), log: Path | None = None, peer: Path = PEER) -> Server:  # fmt: skip
    """A llama-server started as `start` says, ready; the caller ends it."""
    model = gguf(source, weights, peer)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [str(binary("llama-server", peer)), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
               "-t", str(threads), "-tb", str(threads), "-np", str(parallel), "-c", str(parallel * context), "-cb",
               "--alias", NAME, *extra]  # fmt: skip
    log = log or peer / f"server-{weights}.log"
    proc = subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    import httpx

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                props = httpx.get(f"{url}/props", timeout=5).json()
                settings = {"total_slots": props.get("total_slots"),
                            "n_ctx_per_slot": props.get("default_generation_settings", {}).get("n_ctx")}  # fmt: skip
                return Server(proc, url, weights, command, settings)
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"llama-server exited:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("llama-server was not ready in 300 s")


def stop() -> None:
    """End the server `start` started, if any."""
    global _server
    if _server is not None:
        end(_server)
        _server = None


def end(server: Server) -> None:
    server.proc.terminate()
    try:
        server.proc.wait(30)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()


def missing(peer: Path = PEER) -> str:
    """Why this peer cannot run here ('' when it can)."""
    if not binary("llama-server", peer).exists() or not binary("llama-quantize", peer).exists():
        return f"llama-server is not built in {peer}: python bench/peer_llamacpp.py install (about 16 minutes)"
    return ""


class Peer:
    """bench_lm_serve.py's system `llama.cpp:WEIGHTS`: its own llama-server on the GGUF of those weights."""

    def __init__(self, source: Path, repository: Path, threads: int, log: Path, option: str | None = None) -> None:
        weights = option or "Q4_1"
        if weights not in WEIGHTS:
            raise SystemExit(f"llama.cpp:{weights} is not one of {', '.join(WEIGHTS)}")
        self.server = launch(source, weights, threads, log=log)

    def cell(self, prompts: list[list[int]], new_tokens: int) -> dict[str, Any]:
        return concurrent(prompts, lambda prompt: stream(self.server.url, prompt, new_tokens))

    def close(self) -> None:
        end(self.server)


def _running(weights: str | None) -> Server:
    if _server is None or (weights is not None and weights != _server.weights):
        start(weights=weights or "Q4_1")
    assert _server is not None
    return _server


def stream(url: str, prompt: list[int], new_tokens: int) -> dict[str, Any]:
    """One streamed /v1/completions request: its time to first text, the gaps between pieces, the tokens
    the server counted (usage) and the text."""
    from lm_serve_clients import sse

    body = {"model": NAME, "prompt": prompt, "max_tokens": new_tokens, "stream": True,
            "stream_options": {"include_usage": True}, **GREEDY}  # fmt: skip
    sent = time.perf_counter()
    times, text, tokens = [], [], 0
    for chunk in sse(f"{url}/v1/completions", body):
        if "error" in chunk:
            raise RuntimeError(f"llama-server streamed an error: {chunk['error']}")
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
        if chunk.get("choices") and chunk["choices"][0].get("text"):
            times.append(time.perf_counter())
            text.append(chunk["choices"][0]["text"])
    ttft = times[0] - sent if times else float("nan")
    return {"ttft": ttft, "gaps": list(np.diff(times)), "tokens": tokens, "pieces": len(times), "text": "".join(text)}


def complete(url: str, prompt: list[int], new_tokens: int) -> str:
    """One /v1/completions request, not streamed: its text."""
    import httpx

    body = {"model": NAME, "prompt": prompt, "max_tokens": new_tokens, "stream": False, **GREEDY}
    answer = httpx.post(f"{url}/v1/completions", json=body, timeout=600)
    if answer.status_code != 200:
        raise RuntimeError(f"llama-server answered {answer.status_code}: {answer.text[:500]}")
    return answer.json()["choices"][0]["text"]


def cell(prompts: list[list[int]], new_tokens: int, weights: str | None = None) -> dict[str, Any]:
    """All `prompts` streamed at once, one thread each: summary()'s figures plus `texts` (each stream's
    text, ` w{id}` per token). `weights` (F32, Q8_0, Q4_1) restarts the server on those when it serves
    others; None keeps the running one (Q4_1 when none runs)."""
    result, _ = streams(prompts, new_tokens, weights)
    return result


def streams(prompts: list[list[int]], new_tokens: int, weights: str | None = None) -> tuple[dict, list[dict]]:
    """cell()'s figures and texts, and each stream's own record (its `tokens` counted by the server)."""
    url = _running(weights).url
    results, wall = run_all(prompts, lambda prompt: stream(url, prompt, new_tokens))
    result = summary(results, wall)
    result["texts"] = [r["text"] for r in results]
    return result, results


# -- this peer alone: python bench/peer_llamacpp.py -------------------------------------------------


def quiet(limit: float = 2.5, wait: float = 120) -> float:
    """Wait up to `wait` seconds for the 1-minute load average to fall under `limit`; the load then."""
    deadline = time.monotonic() + wait
    while os.getloadavg()[0] >= limit and time.monotonic() < deadline:
        time.sleep(10)
    return os.getloadavg()[0]


def reference(source: Path, prompt: list[int], new_tokens: int) -> str:
    """transformers' greedy text for `prompt` (fp32, one thread): proves the GGUF is the same model."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(source, attn_implementation="eager").eval()
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, pad_token_id=0)  # fmt: skip
    return "".join(f" w{i}" for i in out[0, len(prompt) :].tolist())


def measure(source: Path, weights: str, counts: list[int], prompts: list[list[int]], new_tokens: int,
            threads: int, load_limit: float, load_wait: float) -> dict[str, Any]:  # fmt: skip
    """One GGUF served: a cell per stream count (with the load it ran under), whether every stream got
    its tokens, and whether the largest cell's greedy texts equal each prompt served alone, streamed
    and not streamed."""
    url = start(source, weights, threads)
    assert _server is not None
    record: dict[str, Any] = {"weights": weights, "command": _server.command[1:], **_server.settings, "cells": []}
    cell(prompts[:1], 4)  # warm up
    for n in counts:
        load = quiet(load_limit, load_wait)
        figures, each = streams(prompts[:n], new_tokens)
        texts = figures.pop("texts")
        figures.update(load_1min=load, load_after=os.getloadavg()[0],
                       streams_complete=sum(r["tokens"] == new_tokens and r["pieces"] == new_tokens for r in each),
                       tokens_each=[r["tokens"] for r in each])  # fmt: skip
        record["cells"].append(figures)
        print(f"{weights} {n:>2} streams: {figures['tokens_per_s']:.1f} tok/s, TTFT p50/p95 "
              f"{figures['ttft_s']['p50']:.3f}/{figures['ttft_s']['p95']:.3f} s, per token p50/p95 "
              f"{figures['per_token_s']['p50'] * 1000:.1f}/{figures['per_token_s']['p95'] * 1000:.1f} ms, "
              f"complete {figures['streams_complete']}/{n}, load {load:.2f}", flush=True)  # fmt: skip
    alone = [stream(url, p, new_tokens)["text"] for p in prompts[: counts[-1]]]
    whole = [complete(url, p, new_tokens) for p in prompts[: counts[-1]]]
    record.update(texts_concurrent=texts, texts_alone=alone,
                  concurrent_equal_alone=sum(a == b for a, b in zip(texts, alone, strict=True)),
                  streamed_equal_unstreamed=sum(a == b for a, b in zip(alone, whole, strict=True)),
                  of=len(alone))  # fmt: skip
    equal, unstreamed = record["concurrent_equal_alone"], record["streamed_equal_unstreamed"]
    print(f"{weights}: {counts[-1]} concurrent greedy texts equal alone {equal}/{len(alone)}; "
          f"streamed equal unstreamed {unstreamed}/{len(alone)}", flush=True)  # fmt: skip
    stop()
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs="?", choices=["install", "measure"], default="measure")
    parser.add_argument("--source", type=Path, default=Path("/tmp/lm-serve-bench/source"))
    parser.add_argument("--weights", nargs="+", choices=WEIGHTS, default=list(WEIGHTS))
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--load-limit", type=float, default=2.5, help="wait for a 1-minute load under this")
    parser.add_argument("--load-wait", type=float, default=120, help="but at most this many seconds a cell")
    parser.add_argument("--reference-tokens", type=int, default=16, help="F32's first tokens vs transformers'")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "lm_serve_llamacpp.json")
    args = parser.parse_args()
    if args.command == "install" or not binary("llama-server").exists():
        install()
        if args.command == "install":
            return
    rng = np.random.default_rng(0)  # the bench's prompts
    prompts = [[1, *rng.integers(3, VOCAB - 1, size=args.prompt_tokens - 1).tolist()] for _ in range(max(args.streams))]
    result: dict[str, Any] = {"peer": f"llama-server (llama.cpp vendored in llama-cpp-python {VERSION})",
                              "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
                              "threads": args.threads, "greedy": GREEDY, "runs": []}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    try:
        for weights in args.weights:
            result["runs"].append(measure(args.source, weights, args.streams, prompts, args.new_tokens, args.threads,
                                          args.load_limit, args.load_wait))  # fmt: skip
            args.out.write_text(json.dumps(result, indent=1))
    finally:
        stop()
    first = {r["weights"]: r["texts_alone"] for r in result["runs"]}
    if "F32" in first:
        n = args.reference_tokens
        expected = reference(args.source, prompts[0], n)
        got = " ".join(first["F32"][0].split()[:n])
        result["f32_first_tokens_equal_transformers"] = got == expected.strip()
        print(f"F32's first {n} greedy tokens equal transformers': {got == expected.strip()}")
        for weights, texts in first.items():
            same = sum(a == b for a, b in zip(texts, first["F32"], strict=True))
            result.setdefault("texts_equal_f32", {})[weights] = same
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}))


if __name__ == "__main__":
    main()
