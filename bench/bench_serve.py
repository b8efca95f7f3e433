"""Benchmark `pipe serve` against its ceiling and a naive baseline, side by side in one run.

    .venv/bin/python bench/bench_serve.py [--seconds 2] [--repeats 2] [--out bench/results/serve.json]

For a small model (MLP 784-256-256-10) and a heavy one (MLP 1024-2048-2048-1000) it measures:
  - raw: an onnxruntime session called in-process, batch 1 and batch 32 (the ceiling);
  - naive: a FastAPI endpoint calling session.run once per request (the usual first server);
  - pipe: `pipe serve` (dynamic batching, binary tensors);
each at concurrency 1, 8 and 32, with JSON bodies and with binary bodies (V2 binary tensors for
pipe; the raw float32 bytes for naive, which is as cheap as binary can be). Every request carries
one row. The load generator is a minimal HTTP/1.1 client on uvloop streams with exactly C
keep-alive connections to 127.0.0.1, bounded by time. Results: a printed table, the ratios the
issue sets goals for, and JSON.

The machine is shared: the load generator, the server and anything else running compete for the
same cores, so absolute numbers move between runs; ratios measured in one run are what to quote.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import uvloop
from fastapi import FastAPI, Request, Response  # the naive baseline's framework (resolved by annotations)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "serve"))  # the same model builders the tests use

MODELS = {"small": [784, 256, 256, 10], "heavy": [1024, 2048, 2048, 1000]}
CONCURRENCY = (1, 8, 32)


# -- the naive baseline: what a first FastAPI server usually looks like ------------------------------


def naive_app(model_path: str) -> Any:
    """FastAPI + one session; session.run per request, in FastAPI's thread pool (sync endpoints)."""
    import onnxruntime as ort

    session = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    input_name, output_name = session.get_inputs()[0].name, session.get_outputs()[0].name
    app = FastAPI()

    @app.post("/v2/models/m/infer")
    def infer(body: dict) -> dict:
        tensor = body["inputs"][0]
        x = np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
        (y,) = session.run([output_name], {input_name: x})
        return {"model_name": "m", "outputs": [{"name": output_name, "datatype": "FP32", "shape": list(y.shape),
                                                 "data": y.ravel().tolist()}]}  # fmt: skip

    @app.post("/raw")
    async def raw(request: Request) -> Response:
        x = np.frombuffer(await request.body(), dtype=np.float32).reshape(1, -1)
        (y,) = session.run([output_name], {input_name: x})
        return Response(y.tobytes(), media_type="application/octet-stream")

    return app


# -- servers -----------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready in {timeout}s")


def start(kind: str, model_dir: Path, log: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    env = {**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ.get('PATH', '')}"}
    if kind == "pipe":
        command = [sys.executable, "-m", "pipeline", "serve", str(model_dir), "--port", str(port), "--poll", "0"]
        command += ["--log-level", "warning"]
        probe = f"http://127.0.0.1:{port}/v2/health/ready"
    else:
        command = [sys.executable, __file__, "--naive", str(model_dir / "1" / "model.onnx"), "--port", str(port)]
        probe = f"http://127.0.0.1:{port}/docs"
    with open(log, "ab") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    wait_ready(probe, proc)
    return proc, port


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# -- requests ----------------------------------------------------------------------------------------


def request_for(kind: str, encoding: str, port: int, x: np.ndarray) -> tuple[str, bytes, dict[str, str]]:
    """(url, body, headers) for one single-row request."""
    base = f"http://127.0.0.1:{port}"
    if encoding == "json":
        body = json.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                       "data": x.ravel().tolist()}]}).encode()  # fmt: skip
        return f"{base}/v2/models/m/infer", body, {"content-type": "application/json"}
    if kind == "naive":
        return f"{base}/raw", x.tobytes(), {"content-type": "application/octet-stream"}
    header = json.dumps({
        "inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes}}],
        "outputs": [{"name": "logits", "parameters": {"binary_data": True}}],
    }).encode()  # fmt: skip
    headers = {"inference-header-content-length": str(len(header)), "content-type": "application/octet-stream"}
    return f"{base}/v2/models/m/infer", header + x.tobytes(), headers


async def load(url: str, body: bytes, headers: dict[str, str], concurrency: int, seconds: float) -> dict[str, float]:
    """C keep-alive connections each sending back-to-back requests for `seconds` (after a warm-up).

    A minimal HTTP/1.1 client on asyncio streams (uvloop): the request bytes are built once and the
    response is read by Content-Length. A general client (aiohttp) costs several times more CPU
    per request, and on a 2-core machine the load generator's CPU comes out of the server's.
    """
    parsed = urlsplit(url)
    head = [f"POST {parsed.path} HTTP/1.1", f"host: {parsed.netloc}", f"content-length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    request = ("\r\n".join(head) + "\r\n\r\n").encode() + body
    latencies: list[float] = []  # successful requests only
    errors = 0

    async def worker(until: float, record: bool) -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection(parsed.hostname, parsed.port)
        try:
            while time.perf_counter() < until:
                t0 = time.perf_counter()
                writer.write(request)
                response_head = await reader.readuntil(b"\r\n\r\n")
                length = int(re.search(rb"(?im)^content-length: *(\d+)", response_head).group(1))
                await reader.readexactly(length)
                ok = response_head[9:12] == b"200"
                if record and ok:
                    latencies.append(time.perf_counter() - t0)
                errors += not ok
        finally:
            writer.close()

    warm = time.perf_counter() + min(1.0, seconds / 3)
    await asyncio.gather(*(worker(warm, False) for _ in range(concurrency)))
    started = time.perf_counter()
    await asyncio.gather(*(worker(started + seconds, True) for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    lat = np.array(latencies) * 1000
    return {
        "rows_per_s": len(latencies) / elapsed,
        "p50_ms": float(np.percentile(lat, 50)) if lat.size else float("nan"),  # every request failed: no latency
        "p99_ms": float(np.percentile(lat, 99)) if lat.size else float("nan"),
        "requests": len(latencies),
        "errors": errors,
    }


def raw_session(model_path: Path, batch: int, seconds: float) -> dict[str, float]:
    """The ceiling: session.run in-process on a ready numpy batch, no HTTP."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((batch, session.get_inputs()[0].shape[1])).astype(np.float32)
    for _ in range(3):
        session.run(None, {"x": x})
    runs, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        session.run(None, {"x": x})
        runs += 1
    elapsed = time.perf_counter() - started
    return {"rows_per_s": runs * batch / elapsed, "ms_per_run": elapsed / runs * 1000}


# -- the run -----------------------------------------------------------------------------------------


def build_models(workdir: Path) -> dict[str, Path]:
    from serve_models import mlp, write_artifact

    dirs = {}
    for name, sizes in MODELS.items():
        repo = workdir / name
        write_artifact(repo, "m", 1, mlp(sizes, seed=0))
        dirs[name] = repo / "m"
    return dirs


def batch_counters(port: int) -> tuple[float, float]:
    """(inference_count, execution_count) from pipe serve's /metrics."""
    import httpx

    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    values = {}
    for line in text.splitlines():
        for name in ("pipe_inference_count_total", "pipe_execution_count_total"):
            if line.startswith(name + "{"):
                values[name] = float(line.rsplit(" ", 1)[1])
    return values["pipe_inference_count_total"], values["pipe_execution_count_total"]


def median_cells(cells: list[dict[str, float]]) -> dict[str, float]:
    return {k: float(np.median([c[k] for c in cells])) for k in cells[0]}


def measure_model(model: str, model_dir: Path, workdir: Path, seconds: float, repeats: int) -> dict[str, Any]:
    """Both servers up at once; every cell measured naive, then pipe, back to back, `repeats` times."""
    onnx_path = model_dir / "1" / "model.onnx"
    x = np.random.default_rng(1).standard_normal((1, MODELS[model][0])).astype(np.float32)
    samples: dict[str, dict[str, list]] = {"raw": {}, "naive": {}, "pipe": {}}
    servers = {kind: start(kind, model_dir, workdir / f"{kind}.log") for kind in ("naive", "pipe")}
    try:
        for _ in range(repeats):
            for batch in (1, 32):
                samples["raw"].setdefault(f"batch{batch}", []).append(raw_session(onnx_path, batch, seconds))
            for encoding in ("json", "binary"):
                for c in CONCURRENCY:
                    for kind, (_, port) in servers.items():
                        url, body, headers = request_for(kind, encoding, port, x)
                        before = batch_counters(port) if kind == "pipe" else None
                        cell = uvloop.run(load(url, body, headers, c, seconds))
                        if before:
                            after = batch_counters(port)
                            cell["avg_batch"] = (after[0] - before[0]) / max(1.0, after[1] - before[1])
                        samples[kind].setdefault(f"{encoding}_c{c}", []).append(cell)
    finally:
        for proc, _ in servers.values():
            stop(proc)
    entry: dict[str, Any] = {"sizes": MODELS[model], "repeats": repeats}
    for kind, cells in samples.items():
        entry[kind] = {key: median_cells(values) for key, values in cells.items()}
    for key, cell in entry["raw"].items():
        print(f"{model:5} raw    {key:10}: {cell['rows_per_s']:9.0f} rows/s  ({cell['ms_per_run']:.2f} ms per run)")
    for key in entry["pipe"]:
        for kind in ("naive", "pipe"):
            cell = entry[kind][key]
            extra = f"  avg batch {cell['avg_batch']:5.1f}" if "avg_batch" in cell else ""
            print(f"{model:5} {kind:6} {key:10}: {cell['rows_per_s']:9.0f} rows/s  p50 {cell['p50_ms']:7.2f} ms  "
                  f"p99 {cell['p99_ms']:7.2f} ms  errors {cell['errors']:.0f}{extra}")  # fmt: skip
    return entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="measured seconds per cell")
    parser.add_argument("--repeats", type=int, default=2, help="rounds per cell; the median is reported")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "serve.json")
    parser.add_argument("--naive", help=argparse.SUPPRESS)  # internal: run the naive server on this model
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.naive:
        import uvicorn

        uvicorn.run(naive_app(args.naive), host="127.0.0.1", port=args.port, log_level="warning",
                    loop="uvloop", http="httptools", access_log=False)  # fmt: skip
        return

    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_avg": os.getloadavg()},
        "seconds_per_cell": args.seconds,
        "models": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for model, model_dir in build_models(workdir).items():
            results["models"][model] = measure_model(model, model_dir, workdir, args.seconds, args.repeats)
    results["machine"]["load_avg_after"] = os.getloadavg()
    results["ratios"] = ratios(results["models"])
    print("\nratios (same run; goals: small c=32 pipe/naive >= 1.5, heavy c=32 pipe/raw batch-32 >= 0.8):")
    for key, value in results["ratios"].items():
        print(f"  {key:45} {value:6.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {args.out}")


def ratios(models: dict[str, Any]) -> dict[str, float]:
    """The goals of issue 5, plus context: pipe vs naive and vs the raw session's batch-32 ceiling."""
    out = {}
    for model, entry in models.items():
        ceiling = entry["raw"]["batch32"]["rows_per_s"]
        for encoding in ("json", "binary"):
            for c in CONCURRENCY:
                pipe = entry["pipe"][f"{encoding}_c{c}"]["rows_per_s"]
                naive = entry["naive"][f"{encoding}_c{c}"]["rows_per_s"]
                out[f"{model} {encoding} c={c}: pipe / naive"] = pipe / naive
            out[f"{model} {encoding} c=32: pipe / raw batch-32"] = (
                entry["pipe"][f"{encoding}_c32"]["rows_per_s"] / ceiling
            )
    return out


if __name__ == "__main__":
    main()
