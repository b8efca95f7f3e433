"""onnxruntime-genai as a peer of `pipe serve` in bench/bench_lm_serve.py (`--systems genai[:OPTION]`).

onnxruntime-genai has no HTTP server. What a user of it does with many prompts at once is its
`Generator` with the prompts as one batch (greedy, max_length = prompt + new tokens, min_length the
same so EOS never stops a stream early), or its `Engine`, one request per prompt (0.18's Engine on
the CPU batches statically: its continuous batching needs a PagedAttention graph, which its model
builder makes for CUDA fp16/bf16 only). OPTION: "generator" (default) or "engine" on the artifact's
own model.onnx, the graph pipe serves (past/present concatenated; past_present_share_buffer false, as a
shared buffer needs GroupQueryAttention), named to onnxruntime-genai by a genai_config.json written
beside a symlink in a temporary directory (the artifact is only read); "builder" or "builder-engine"
on the graph onnxruntime-genai's model builder makes from the same transformers source (`build`).
Its tokenizer cannot read the artifact's word-level tokenizer.json ("Cannot know how to parse line"),
so it is fed token ids; `outputs` are each stream's new ids.

The peer lives in its own venv outside the repository (15 s here; it pulls onnxruntime 1.32.0):

    python3 -m venv /work/peers/genai
    /work/peers/genai/bin/pip install onnxruntime-genai==0.18.0 numpy     # or: peer_genai.py --install

`Peer` runs bench/peer_genai_worker.py under that venv's Python: a worker that loads the model once and
answers cells as JSON lines on stdin/stdout. Times are taken in the worker around onnxruntime-genai's
calls: a cell starts before the generator (or the requests) is made; a stream's time to first token
is from there to its first new id, its per-token times between its successive ids; tokens/s is every
stream's ids over the cell's wall time. pipe is timed at an HTTP client: this peer pays no HTTP, SSE
or JSON per token, which is in its favour.

    .venv/bin/python bench/peer_genai.py [--streams 1 4 16] [--options generator engine builder ...]
    .venv/bin/python bench/peer_genai.py --check [--check-builder]    # greedy parity, 32 new tokens
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
VENV = Path("/work/peers/genai")
BUILDER_VENV = Path("/work/peers/genai-builder")
BUILT = Path("/work/peers/genai-built")
PACKAGES = ["onnxruntime-genai==0.18.0", "numpy"]
# genai:OPTION in bench_lm_serve.py: (the model builder's graph instead of the artifact's, the mode)
OPTIONS = {"generator": (False, "generator"), "engine": (False, "engine"), "builder": (True, "generator"),
           "builder-engine": (True, "engine")}  # fmt: skip


def install(venv: Path = VENV) -> Path:
    """Make the peer's venv (onnxruntime-genai pinned, and the onnxruntime it pulls); its Python."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *PACKAGES], check=True)
    return python


def genai_config(version: Path, threads: int, max_batch: int) -> dict[str, Any]:
    """onnxruntime-genai's genai_config.json for an artifact version's decoder, from its manifest.

    The graph's own input and output names (position_ids included), the cache layout the manifest
    records, EOS/BOS/pad ids and the context length; `threads` intra-op threads; the Engine asked for
    `max_batch` sequences (0.18's static scheduler still takes 4 at a time). past_present_share_buffer
    stays false: a shared buffer needs a graph that writes its present into the past in place
    (GroupQueryAttention); this graph concatenates.
    """
    manifest = json.loads((version / "manifest.json").read_text())
    generation, cache = manifest["generation"], manifest["generation"]["cache"]
    vocab = next(i["tokens"]["vocab_size"] for i in manifest["inputs"] if i["name"] == "input_ids")
    past, present = cache["past"], cache["present"]
    return {
        "model": {
            "type": "llama",
            "bos_token_id": generation["bos_token_id"],
            "eos_token_id": generation["eos_token_ids"],
            "pad_token_id": generation["padding_id"],
            "vocab_size": vocab,
            "context_length": generation["context_length"],
            "decoder": {
                "session_options": {
                    "log_id": "onnxruntime-genai",
                    "intra_op_num_threads": threads,
                    "inter_op_num_threads": 1,
                    "provider_options": [],
                },
                "filename": "model.onnx",
                "head_size": cache["head_size"],
                "num_key_value_heads": cache["kv_heads"],
                "num_hidden_layers": cache["layers"],
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    "position_ids": "position_ids",
                    "past_key_names": past.format(layer="%d", kind="key"),
                    "past_value_names": past.format(layer="%d", kind="value"),
                },
                "outputs": {
                    "logits": "logits",
                    "present_key_names": present.format(layer="%d", kind="key"),
                    "present_value_names": present.format(layer="%d", kind="value"),
                },
            },
        },
        "search": {
            "do_sample": False,
            "num_beams": 1,
            "past_present_share_buffer": False,
            "max_length": generation["context_length"],
        },
        "engine": {"static_batching": {"max_batch_size": max_batch}},
    }


def missing(venv: Path = VENV) -> str:
    """Why this peer cannot run here ("" when it can): its venv is not made."""
    if not (venv / "bin" / "python").exists():
        return f"no onnxruntime-genai venv at {venv}: `.venv/bin/python bench/peer_genai.py --install`"
    return ""


class Peer:
    """onnxruntime-genai in a worker process, model loaded; bench_lm_serve.py's `cell` and `close`.

    `option` (`genai:OPTION`): "generator" (None), "engine", "builder" or "builder-engine": the
    Generator or the Engine, on the artifact's model.onnx or on the model builder's own graph of
    `source` (made once by `build`, kept under /work/peers/genai-built by the source's digest).
    """

    def __init__(self, source: Path, repository: Path, threads: int, log: Path, option: str | None = None,
                 name: str = "llama-135m", venv: Path = VENV) -> None:  # fmt: skip
        if (option or "generator") not in OPTIONS:
            raise SystemExit(f"genai:{option} is not one of {', '.join(OPTIONS)}")
        builder, mode = OPTIONS[option or "generator"]
        if missing(venv):
            raise SystemExit(missing(venv))
        from tokenizers import Tokenizer

        artifact = Path(repository) / name / "1"
        self.directory = model_directory(artifact, build(Path(source)) if builder else None, threads)
        self.tokenizer = Tokenizer.from_file(str(artifact / "tokenizer" / "tokenizer.json"))
        self.eos = set(json.loads((self.directory / "genai_config.json").read_text())["model"]["eos_token_id"])
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        worker = Path(__file__).with_name("peer_genai_worker.py")
        command = [str(venv / "bin" / "python"), str(worker), str(self.directory), "--mode", mode]
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log.open("wb"),
                                     text=True, env=env)  # fmt: skip
        try:
            self.ready = self._read()  # {"load_s", "onnxruntime_genai", "onnxruntime", "engine_max_batch"}
        except SystemExit:
            self.close()
            raise

    def _read(self) -> dict[str, Any]:
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line:
            raise SystemExit(f"the onnxruntime-genai worker exited ({self.proc.wait()}): see its log")
        answer = json.loads(line)
        if "error" in answer:
            raise SystemExit(f"onnxruntime-genai failed: {answer['error']}")
        return answer

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """One request to the worker and its answer."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def generate(self, prompts: list[list[int]], new_tokens: int) -> dict[str, Any]:
        """The worker's records of one cell: {"streams": [{ttft, gaps, tokens, ids}], "wall": s}."""
        return self.ask({"op": "cell", "prompts": prompts, "new_tokens": new_tokens})

    def cell(self, prompts: list[list[int]], new_tokens: int) -> dict[str, Any]:
        """`summary()` of one cell of len(prompts) streams, plus `outputs`: each stream's new ids."""
        from lm_serve_clients import summary

        done = self.generate(prompts, new_tokens)
        result = summary(done["streams"], done["wall"])
        result["outputs"] = [s["ids"] for s in done["streams"]]
        return result

    def text(self, ids: list[int]) -> str:
        """Generated ids as a client sees them: decoded by the artifact's tokenizer, EOS dropped."""
        return self.tokenizer.decode([i for i in ids if i not in self.eos])

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.ask({"op": "quit"})
            except (SystemExit, BrokenPipeError):
                pass
            self.proc.wait(30)
        shutil.rmtree(self.directory, ignore_errors=True)


def model_directory(artifact: Path, built: Path | None, threads: int) -> Path:
    """A temporary directory onnxruntime-genai loads: symlinks to the graph and its genai_config.json.

    `built` None: the artifact's model.onnx with `genai_config`. Otherwise the builder's directory, its
    own config given the same threads and Engine batch.
    """
    if built is None:
        config, links = genai_config(artifact, threads, max_batch=16), [artifact / "model.onnx"]
    else:
        config = json.loads((built / "genai_config.json").read_text())
        config["model"]["decoder"]["session_options"].update({"intra_op_num_threads": threads,
                                                              "inter_op_num_threads": 1})  # fmt: skip
        config["engine"] = {"static_batching": {"max_batch_size": 16}}
        links = [path.resolve() for path in built.iterdir() if path.name != "genai_config.json"]
    directory = Path(tempfile.mkdtemp(prefix="peer-genai-"))
    for path in links:
        (directory / path.name).symlink_to(path)
    (directory / "genai_config.json").write_text(json.dumps(config, indent=1))
    return directory


def build(source: Path, venv: Path = BUILDER_VENV) -> Path:
    """onnxruntime-genai's own graph of a transformers directory (its model builder, fp32, CPU), made once.

    The builder writes GroupQueryAttention with past_present_share_buffer true and no position_ids
    input: what its docs tell a user to run. It needs torch and transformers beside onnxruntime-genai,
    in a venv of its own (about 4 minutes here; a build about 3):
        python3 -m venv /work/peers/genai-builder
        /work/peers/genai-builder/bin/pip install onnxruntime-genai==0.18.0 torch==2.13.0 transformers onnx onnx-ir
    """
    digest = hashlib.sha256((source / "model.safetensors").read_bytes()).hexdigest()[:16]
    out = BUILT / digest
    if (out / "genai_config.json").exists():
        return out
    if not (venv / "bin" / "python").exists():
        raise SystemExit(f"no model-builder venv at {venv}: see bench/peer_genai.py's build()")
    command = [str(venv / "bin" / "python"), "-m", "onnxruntime_genai.models.builder", "-m", str(source),
               "-i", str(source), "-o", str(out), "-p", "fp32", "-e", "cpu", "-c", str(BUILT / "cache")]  # fmt: skip
    done = subprocess.run(command, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"onnxruntime-genai's model builder failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return out


# -- alone: figures at 1, 4 and 16 streams, and the greedy checks ----------------------------------


def pipe_greedy(repository: Path, prompts: list[list[int]], new_tokens: int, threads: int) -> list[str]:
    """pipe serve's unstreamed greedy text for each prompt (/v1/completions, temperature 0, concurrent)."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx
    from lm_serve_clients import PipeServe
    from lm_serve_model import NAME

    pipe = PipeServe(repository, NAME, threads, Path(tempfile.gettempdir()) / "peer-genai-pipe.log")
    try:

        def one(prompt: list[int]) -> str:
            body = {"model": NAME, "prompt": prompt, "max_tokens": new_tokens, "temperature": 0}
            answer = httpx.post(f"{pipe.url}/v1/completions", json=body, timeout=900)
            answer.raise_for_status()
            return answer.json()["choices"][0]["text"]

        with ThreadPoolExecutor(len(prompts)) as pool:
            return list(pool.map(one, prompts))
    finally:
        pipe.close()


def share_buffer_probe(artifact: Path, prompt: list[int], new_tokens: int, threads: int, venv: Path) -> str:
    """What onnxruntime-genai does with past_present_share_buffer true on the artifact's graph."""
    directory = model_directory(artifact, None, threads)
    try:
        config = json.loads((directory / "genai_config.json").read_text())
        config["search"]["past_present_share_buffer"] = True
        (directory / "genai_config.json").write_text(json.dumps(config))
        script = (
            "import sys, json, numpy as np, onnxruntime_genai as og\n"
            "m = og.Model(sys.argv[1]); p = og.GeneratorParams(m); n = int(sys.argv[3])\n"
            "prompt = json.loads(sys.argv[2])\n"
            "p.set_search_options(do_sample=False, max_length=len(prompt) + n, min_length=len(prompt) + n)\n"
            "g = og.Generator(m, p); g.append_tokens(np.array([prompt], dtype=np.int32)); out = []\n"
            "while not g.is_done():\n    g.generate_next_token(); out.append(int(g.get_next_tokens()[0]))\n"
            "print(json.dumps(out))\n"
        )
        done = subprocess.run([str(venv / "bin" / "python"), "-c", script, str(directory), json.dumps(prompt),
                               str(new_tokens)], capture_output=True, text=True, timeout=900)  # fmt: skip
        if done.returncode != 0:
            return "error: " + (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        return done.stdout.strip().splitlines()[-1]
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def check(source: Path, repository: Path, prompts: list[list[int]], new_tokens: int, threads: int,
          builder: bool) -> dict[str, Any]:  # fmt: skip
    """Greedy parity: a batch against each prompt alone, padding, the Engine, pipe serve, a shared buffer."""
    log = Path(tempfile.gettempdir()) / "peer-genai-check.log"
    prefix = "builder-" if builder else ""
    report: dict[str, Any] = {"new_tokens": new_tokens, "graph": "builder" if builder else "artifact"}
    peer = Peer(source, repository, threads, log, "builder" if builder else "generator")
    try:
        batch = [s["ids"] for s in peer.generate(prompts, new_tokens)["streams"]]
        alone = [peer.generate([p], new_tokens)["streams"][0]["ids"] for p in prompts]
        report["batch_equals_alone"] = f"{sum(a == b for a, b in zip(batch, alone, strict=True))}/{len(prompts)}"
        mixed = [p[: len(p) - 31 * k] for k, p in enumerate(prompts[:4])]  # 128, 97, 66, 35 tokens
        padded = [s["ids"] for s in peer.generate(mixed, new_tokens)["streams"]]
        mixed_alone = [peer.generate([p], new_tokens)["streams"][0]["ids"] for p in mixed]
        same = sum(a == b for a, b in zip(padded, mixed_alone, strict=True))
        report["padded_batch_equals_alone"] = f"{same}/{len(mixed)} (prompt lengths {[len(p) for p in mixed]})"
        texts = [peer.text(ids) for ids in batch]
        report["distinct_ids_per_stream"] = [len(set(ids)) for ids in batch]
    finally:
        peer.close()
    engine = Peer(source, repository, threads, log, prefix + "engine")
    try:
        report["engine_max_batch"] = engine.ready.get("engine_max_batch")
        served = [s["ids"] for s in engine.generate(prompts, new_tokens)["streams"]]
        report["engine_equals_generator"] = f"{sum(a == b for a, b in zip(served, batch, strict=True))}/{len(prompts)}"
    finally:
        engine.close()
    piped = pipe_greedy(repository, prompts, new_tokens, threads)
    same = sum(a.strip() == b.strip() for a, b in zip(piped, texts, strict=True))
    report["pipe_serve_equals_generator"] = f"{same}/{len(prompts)}"
    if not builder:
        artifact = repository / "llama-135m" / "1"
        report["share_buffer_true"] = share_buffer_probe(artifact, prompts[0], 8, threads, VENV)
        report["share_buffer_false_ids"] = batch[0][:8]
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/lm-serve-bench"))
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--options", nargs="+", choices=list(OPTIONS), default=["generator", "engine"])
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--check", action="store_true", help="greedy parity instead of figures")
    parser.add_argument("--check-builder", action="store_true", help="--check on the model builder's graph")
    parser.add_argument("--check-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    parser.add_argument("--install", action="store_true", help=f"make {VENV} and exit")
    args = parser.parse_args()
    if args.install:
        print(install())
        return
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "bench"))
    from lm_serve_model import VOCAB, prepare

    source, repository = prepare(args.dir)
    rng = np.random.default_rng(0)  # the prompts bench_lm_serve.py sends
    prompts = [[1, *rng.integers(3, VOCAB - 1, size=args.prompt_tokens - 1).tolist()] for _ in range(max(args.streams))]
    if args.check or args.check_builder:
        report = check(source, repository, prompts, args.check_tokens, args.threads, args.check_builder)
        print(json.dumps(report, indent=1))
        return
    results: dict[str, Any] = {"threads": args.threads, "prompt_tokens": args.prompt_tokens,
                               "new_tokens": args.new_tokens, "options": {}}  # fmt: skip
    for option in args.options:
        peer = Peer(source, repository, args.threads, Path(tempfile.gettempdir()) / f"peer-genai-{option}.log", option)
        results["versions"] = {k: peer.ready[k] for k in ("onnxruntime_genai", "onnxruntime")}
        cells = []
        try:
            peer.cell(prompts[:1], 4)  # warm up
            for streams in args.streams:
                load_before = os.getloadavg()[0]
                cell = peer.cell(prompts[:streams], args.new_tokens)
                cell["load_1min"] = [load_before, os.getloadavg()[0]]
                cell["distinct_ids"] = [len(set(ids)) for ids in cell.pop("outputs")]
                cells.append(cell)
                ttft, gap, load = cell["ttft_s"], cell["per_token_s"], cell["load_1min"]
                print(f"genai:{option} {streams:>2} streams: {cell['tokens_per_s']:.1f} tok/s, TTFT p50/p95 "
                      f"{ttft['p50']:.2f}/{ttft['p95']:.2f} s, per token p50/p95 {gap['p50'] * 1e3:.0f}/"
                      f"{gap['p95'] * 1e3:.0f} ms, load {load[0]:.1f}->{load[1]:.1f}", flush=True)  # fmt: skip
        finally:
            peer.close()
        ready = peer.ready
        results["options"][option] = {"load_s": ready["load_s"], "engine_max_batch": ready.get("engine_max_batch"),
                                      "cells": cells}  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
