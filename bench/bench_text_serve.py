"""Text models end to end: `pipe import DIR` of a transformers directory, then `pipe serve` answering text.

    .venv/bin/python bench/bench_text_serve.py [--models tiny,minilm] [--seconds 10] [--concurrency 8]
                                               [--texts-per-request 1] [--rounds 3]
                                               [--out bench/results/text_serve.json]

For each model a transformers directory is built here from a config (random weights: speed does not
depend on them; nothing downloaded) with a WordPiece tokenizer trained on a few lines:
  - tiny: BERT, 2 layers, hidden 32, 2 heads, intermediate 64 (the tests' model);
  - minilm: BERT with all-MiniLM-L6-v2's shape: 6 layers, hidden 384, 12 heads, intermediate 1536,
    vocabulary 30522, 512 positions.
Measured: `pipe import DIR --task embedding --normalize` wall time (the command, Python start and
transformers' import included) and, from the import record, the model's load and ONNX export times;
then `pipe serve` (one worker, default batching) answering TF Serving `{"instances": [text]}` from C
concurrent keep-alive clients for `--seconds`: texts per second and p50/p99 latency (`text`), and the
same requests sent as token ids, tokenized here (`ids`), in the same run: what tokenizing in the
server costs, and onnxruntime alone in this process on the same texts at the same rows per run (`raw`,
1 text a run by default: the ceiling without HTTP or batching); `--rounds` interleaves the three, and the
median round of each is reported with every round's figure. Before the timing,
one text request through tritonclient (V2 BYTES, binary) and one through TF Serving strings are
compared with transformers in torch (its tokenizer, its model, mean pooling, L2 norm): the cosine of
each (>= 0.9999 expected).

The machine is shared: the load generator runs in this process on the same cores as the server, so
for the tiny model the client, not the server, may be the limit (`client_cpu_s` says how much CPU it
used).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.serve.serve_process import start_server  # noqa: E402
from tests.text_models import LINES, save_tokenizer  # noqa: E402

SHAPES = {
    "tiny": {"vocab_size": 128, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
             "intermediate_size": 64, "max_position_embeddings": 64},
    "minilm": {"vocab_size": 30522, "hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12,
               "intermediate_size": 1536, "max_position_embeddings": 512},
}  # fmt: skip
TEXTS = [
    "the cat sat on the mat while the dog ran in the park",
    "a bird sang a song in the tree",
    "she read a book by the window",
    "it rained all day in the city and the streets were quiet",
    "cats and dogs are friends",
    "the quick brown fox jumps over the lazy dog",
    "hello world",
    "tokens in, vectors out",
]


def build(directory: Path, shape: dict[str, int]) -> Path:
    """A BERT encoder of `shape` with random weights and the tests' tokenizer, saved with save_pretrained."""
    import torch
    from transformers import BertConfig, BertModel

    save_tokenizer(directory, max_length=128)
    torch.manual_seed(0)
    BertModel(BertConfig(pad_token_id=0, **shape)).eval().save_pretrained(directory)
    return directory


def reference(directory: Path, texts: list[str]) -> np.ndarray:
    """Mean-pooled, L2-normalized embeddings from transformers in torch."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModel.from_pretrained(directory).eval()
    batch = tokenizer(texts, padding=True, truncation=True, max_length=128, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=1).numpy()


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def import_model(directory: Path, repo: Path, name: str) -> dict[str, float]:
    command = [sys.executable, "-m", "pipeline", "import", str(directory), "--name", name, "--repository", str(repo),
               "--task", "embedding", "--normalize"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"pipe import failed:\n{done.stdout}\n{done.stderr}")
    note = re.search(r"loaded in ([\d.]+) s, exported in ([\d.]+) s", done.stdout)
    assert note, done.stdout
    return {"import_wall_s": round(wall, 2), "load_s": float(note[1]), "export_s": float(note[2])}


def parity(address: str, url: str, name: str, expected: np.ndarray) -> dict[str, float]:
    import tritonclient.http as triton

    text = TEXTS[0]
    with triton.InferenceServerClient(address) as client:
        tensor = triton.InferInput("text", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([text.encode()], dtype=object), binary_data=True)
        by_triton = client.infer(name, [tensor]).as_numpy("embedding")[0]
    by_tf = httpx.post(f"{url}/v1/models/{name}:predict", json={"instances": [text]}).json()["predictions"][0]
    return {
        "cosine_tritonclient_bytes": cosine(by_triton, expected[0]),
        "cosine_tf_strings": cosine(by_tf, expected[0]),
    }


def raw(artifact: Path, seconds: float, per_request: int) -> dict[str, float]:
    """onnxruntime alone in this process on the same texts, tokenized beforehand, `per_request` rows a run: the
    ceiling the server is measured against (default session options, as pipe serve's)."""
    import onnxruntime as ort

    rows = id_rows(artifact)
    session = ort.InferenceSession(str(artifact / "model.onnx"), providers=["CPUExecutionProvider"])
    from pipeline.runtime.text import pad_rows

    batches = [
        pad_rows([{k: np.asarray(v) for k, v in rows[(i + j) % len(rows)].items()} for j in range(per_request)],
                 dict.fromkeys(rows[0], 0))
        for i in range(len(rows))
    ]  # fmt: skip
    runs, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        session.run(None, batches[runs % len(batches)])
        runs += 1
    return {"texts_per_s": round(runs * per_request / (time.perf_counter() - started), 1)}


def id_rows(artifact: Path) -> list[dict[str, list[int]]]:
    """TEXTS tokenized as the server tokenizes them, one TF Serving instance each: the same requests as token ids."""
    from pipeline.artifact.directory import Artifact
    from pipeline.runtime.text import TextEncoder

    loaded = Artifact.load(artifact)
    encoder = TextEncoder.of(loaded.root, loaded.manifest)
    assert encoder is not None
    return [{k: v.tolist() for k, v in row.items()} for row in encoder.rows(TEXTS)]


async def load(
    url: str, name: str, seconds: float, concurrency: int, per_request: int, rows: list | None = None
) -> dict[str, float]:
    """C clients sending `per_request` texts each (or, with `rows`, the same texts as token ids) for `seconds`."""
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    sent = rows or TEXTS

    async def client(k: int) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            i = k
            while time.perf_counter() < deadline:
                instances = [sent[(i + j) % len(sent)] for j in range(per_request)]
                started = time.perf_counter()
                answer = await http.post(f"/v1/models/{name}:predict", json={"instances": instances})
                latencies.append(time.perf_counter() - started)
                answer.raise_for_status()
                i += 1

    cpu = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    await asyncio.gather(*(client(k) for k in range(concurrency)))
    wall = time.perf_counter() - started
    used = resource.getrusage(resource.RUSAGE_SELF)
    ms = np.array(latencies) * 1000
    return {
        "texts_per_s": round(len(latencies) * per_request / wall, 1),
        "requests": len(latencies),
        "p50_ms": round(float(np.percentile(ms, 50)), 2),
        "p99_ms": round(float(np.percentile(ms, 99)), 2),
        "client_cpu_s": round(used.ru_utime + used.ru_stime - cpu.ru_utime - cpu.ru_stime, 2),
        "wall_s": round(wall, 2),
    }


def median(rounds: list[dict[str, float]]) -> dict[str, float]:
    """The round with the median texts/s, and every round's texts/s."""
    ordered = sorted(rounds, key=lambda r: r["texts_per_s"])
    return {**ordered[len(ordered) // 2], "rounds": [r["texts_per_s"] for r in rounds]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny,minilm")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--texts-per-request", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    results = {"lines_trained_on": len(LINES), "concurrency": args.concurrency, "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "artifacts"
        for name in args.models.split(","):
            directory = build(Path(tmp) / name, SHAPES[name])
            row: dict[str, object] = {"shape": SHAPES[name], **import_model(directory, repo, name)}
            expected = reference(directory, TEXTS[:1])
            server = start_server([repo / name], Path(tmp) / f"{name}.log", "--poll", "0")
            try:
                row |= parity(server.address, server.url, name, expected)
                asyncio.run(load(server.url, name, 1.0, args.concurrency, args.texts_per_request))  # warm up
                ids = id_rows(repo / name / "1")  # the same requests as token ids: what tokenizing in the server costs
                rounds: dict[str, list[dict[str, float]]] = {"text": [], "ids": [], "raw": []}
                per = args.texts_per_request
                for _ in range(args.rounds):  # interleaved, so each round's three share the machine's noise
                    rounds["text"].append(asyncio.run(load(server.url, name, args.seconds, args.concurrency, per)))
                    rounds["ids"].append(asyncio.run(load(server.url, name, args.seconds, args.concurrency, per, ids)))
                    rounds["raw"].append(raw(repo / name / "1", args.seconds, per))
                row |= {key: median(values) for key, values in rounds.items()}
                row["text_over_ids"] = round(row["text"]["texts_per_s"] / row["ids"]["texts_per_s"], 2)
                row["text_over_raw"] = round(row["text"]["texts_per_s"] / row["raw"]["texts_per_s"], 2)
            finally:
                server.stop()
            results["models"][name] = row
            print(json.dumps({name: row}), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
