"""Benchmark `pipe serve` against a strong FastAPI baseline and raw onnxruntime, side by side in one run.

    .venv/bin/python bench/bench_serve.py [--seconds 2] [--repeats 3] [--profile 6]
                                          [--server-cpus 0] [--client-cpus 1]
                                          [--models small,heavy] [--compare-tree DIR]

The servers run pinned (taskset) to the server CPUs and the load generator (this process) to the
client CPUs, so neither takes the other's cores. For a small model (MLP 784-256-256-10) and a
heavy one (MLP 1024-2048-2048-1000), every round measures:
  - raw: onnxruntime in a process pinned to ONE server CPU, 1 intra-op thread, no HTTP, at batch
    sizes 1..128; its best batch is the ceiling the heavy model's efficiency is judged against;
  - strong: what a careful FastAPI user deploys: uvicorn (uvloop, httptools) with one worker per
    server CPU, an onnxruntime session per worker with intra_op_num_threads=1, an `async def`
    endpoint that reads the body with orjson and hands session.run to the thread pool (the loop
    keeps serving), and orjson responses (ORJSONResponse's own render; that class is deprecated in
    FastAPI 0.165). Binary: the raw little-endian float32 row as the body with its shape in an
    `x-shape` header, answered with the raw output bytes: the cheapest binary a user could pick,
    cheaper than the V2 binary header pipe parses;
  - naive: the previous baseline, one worker, a sync endpoint with FastAPI validating a `dict`
    body, onnxruntime's default threads;
  - pipe: `pipe serve` with one worker per server CPU, 1 intra-op thread, its default batching;
each at concurrency 1, 8 and 32, JSON and binary bodies, one row per request, the servers
measured one after the other within each cell (the order rotates by round). Reported: the median
over rounds of requests/s, p50/p99 latency, and ratios computed within each round.
--compare-tree DIR adds a column, pipe-before: `pipe serve` run from another source tree (a git
worktree of an earlier commit: `git worktree add /tmp/before HEAD~1`), started with PYTHONPATH=DIR
and DIR as its working directory so that tree's `pipeline` package is the one imported (each
server's `pipeline.__file__` is recorded), with the same flags; it is measured in the same rounds
as pipe, and the ratio pipe/pipe-before is reported per cell (requests/s, and requests per
server CPU-second): a change to the server measured before and after in one run, on the same
minute's noise.
--profile N then samples pipe's worker with py-spy for N seconds per case under load (c=32) and
sums where its CPU time goes. The load generator is a minimal HTTP/1.1 client on uvloop streams
with exactly C keep-alive connections to 127.0.0.1, bounded by time; `client_cpu` is the share of
one client core it used (near 1.0 it, not the server, is the limit).

The machine is shared: other work still runs on these cores, so absolute numbers move between
runs; ratios measured in the same round are what to quote.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import platform
import re
import shutil
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
import orjson
import uvloop
from fastapi import Body, FastAPI, Request, Response  # the baselines' framework (resolved by annotations)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "serve"))  # the same model builders the tests use

MODELS = {"small": [784, 256, 256, 10], "heavy": [1024, 2048, 2048, 1000]}
# c=128 only for the heavy model: one-row requests from 32 clients cap a batch at 32 rows, below
# raw onnxruntime's best batch for it, so 128 clients show what batching reaches when it can fill.
CONCURRENCY = {"small": (1, 8, 32), "heavy": (1, 8, 32, 128)}
PIPE_MAX_BATCH = 128  # pipe's --max-batch-size: raw onnxruntime's best batch on this machine (both models)
KINDS = ("pipe", "strong", "naive")
BEFORE = "pipe-before"  # pipe serve from --compare-tree DIR
PIPES = ("pipe", BEFORE)  # the servers speaking pipe's protocol (V2 binary, /metrics)
RAW_BATCHES = (1, 8, 32, 64, 128)
MODEL_ENV = "BENCH_SERVE_MODEL"  # the baselines' worker processes find their model here
STRONG_MODE_ENV = "BENCH_SERVE_STRONG"  # "async" (default) or "sync" endpoints for the strong baseline


# -- the baselines ------------------------------------------------------------------------------------


def strong_app() -> Any:
    """uvicorn factory: FastAPI tuned as its docs advise (see the module docstring)."""
    import onnxruntime as ort
    from starlette.concurrency import run_in_threadpool

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # one worker per core: onnxruntime must not spread over them
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(os.environ[MODEL_ENV], options, providers=["CPUExecutionProvider"])
    input_name, output_name = session.get_inputs()[0].name, session.get_outputs()[0].name
    app = FastAPI()

    def run(x: np.ndarray) -> np.ndarray:
        return session.run([output_name], {input_name: x})[0]

    def json_input(body: bytes) -> np.ndarray:
        tensor = orjson.loads(body)["inputs"][0]
        return np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])

    def json_answer(y: np.ndarray) -> Response:
        body = {"model_name": "m", "outputs": [{"name": output_name, "datatype": "FP32", "shape": y.shape, "data": y}]}
        return Response(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json")

    def raw_input(request: Request, body: bytes) -> np.ndarray:
        return np.frombuffer(body, dtype="<f4").reshape([int(d) for d in request.headers["x-shape"].split(",")])

    def raw_answer(y: np.ndarray) -> Response:
        shape = ",".join(map(str, y.shape))
        return Response(y.tobytes(), media_type="application/octet-stream", headers={"x-shape": shape})

    if os.environ.get(STRONG_MODE_ENV) == "sync":  # FastAPI runs sync endpoints in its thread pool

        @app.post("/v2/models/m/infer")
        def infer_sync(body: dict) -> Response:  # FastAPI parses the JSON body before the call
            tensor = body["inputs"][0]
            return json_answer(run(np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])))

        @app.post("/raw")
        def raw_sync(request: Request, body: bytes = Body(media_type="application/octet-stream")) -> Response:
            return raw_answer(run(raw_input(request, body)))

        return app

    @app.post("/v2/models/m/infer")
    async def infer(request: Request) -> Response:
        return json_answer(await run_in_threadpool(run, json_input(await request.body())))

    @app.post("/raw")
    async def raw(request: Request) -> Response:
        return raw_answer(await run_in_threadpool(run, raw_input(request, await request.body())))

    return app


def naive_app() -> Any:
    """uvicorn factory: the usual first server, session.run per request in a sync endpoint."""
    import onnxruntime as ort

    session = ort.InferenceSession(os.environ[MODEL_ENV], providers=["CPUExecutionProvider"])
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


# -- servers ------------------------------------------------------------------------------------------


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


def server_command(kind: str, model_dir: Path, port: int, workers: int) -> list[str]:
    """The command line each server runs (recorded in the results as run)."""
    if kind in PIPES:
        return [sys.executable, "-m", "pipeline", "serve", str(model_dir), "--port", str(port), "--poll", "0",
                "--workers", str(workers), "--intra-op-threads", "1", "--inter-op-threads", "1",
                "--max-batch-size", str(PIPE_MAX_BATCH),
                "--log-level", "warning"]  # fmt: skip
    factory, workers = ("strong_app", workers) if kind == "strong" else ("naive_app", 1)
    return [sys.executable, "-m", "uvicorn", "--factory", f"bench_serve:{factory}", "--app-dir", str(ROOT / "bench"),
            "--port", str(port), "--workers", str(workers), "--loop", "uvloop", "--http", "httptools",
            "--no-access-log", "--log-level", "warning"]  # fmt: skip


def server_env(kind: str, model_dir: Path, compare_tree: Path | None) -> tuple[dict[str, str], Path]:
    """The environment and working directory a server starts in: pipe-before imports `compare_tree`'s
    `pipeline` (the working directory comes first on sys.path for `python -m`, PYTHONPATH next)."""
    env = {**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ.get('PATH', '')}",
           MODEL_ENV: str(model_dir / "1" / "model.onnx")}  # fmt: skip
    if kind != BEFORE:
        return env, ROOT
    assert compare_tree is not None
    return {**env, "PYTHONPATH": str(compare_tree)}, compare_tree


def pipeline_imported(kind: str, model_dir: Path, compare_tree: Path | None) -> str:
    """The `pipeline` package a server of this kind imports, as its `__file__`."""
    env, cwd = server_env(kind, model_dir, compare_tree)
    probe = [sys.executable, "-c", "import pipeline; print(pipeline.__file__)"]
    return subprocess.run(probe, env=env, cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def start(
    kind: str, model_dir: Path, cpus: list[int], log: Path, compare_tree: Path | None = None
) -> tuple[subprocess.Popen, int, list[str]]:
    port = free_port()
    command = server_command(kind, model_dir, port, len(cpus))
    env, cwd = server_env(kind, model_dir, compare_tree)
    pinned = ["taskset", "-c", ",".join(map(str, cpus)), *command]
    with open(log, "ab") as out:
        proc = subprocess.Popen(pinned, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    probe = "/v2/health/ready" if kind in PIPES else "/docs"
    wait_ready(f"http://127.0.0.1:{port}{probe}", proc)
    return proc, port, command


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# -- requests and load --------------------------------------------------------------------------------


def request_for(kind: str, encoding: str, port: int, x: np.ndarray) -> tuple[str, bytes, dict[str, str]]:
    """(url, body, headers) for one single-row request."""
    base = f"http://127.0.0.1:{port}"
    if encoding == "json":
        body = json.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                       "data": x.ravel().tolist()}]}).encode()  # fmt: skip
        return f"{base}/v2/models/m/infer", body, {"content-type": "application/json"}
    if kind not in PIPES:
        headers = {"content-type": "application/octet-stream", "x-shape": ",".join(map(str, x.shape))}
        return f"{base}/raw", x.astype("<f4").tobytes(), headers
    header = json.dumps({
        "inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes}}],
        "outputs": [{"name": "logits", "parameters": {"binary_data": True}}],
    }).encode()  # fmt: skip
    headers = {"inference-header-content-length": str(len(header)), "content-type": "application/octet-stream"}
    return f"{base}/v2/models/m/infer", header + x.tobytes(), headers


async def load(
    url: str, body: bytes, headers: dict[str, str], concurrency: int, seconds: float, on_start: Any = None
) -> dict[str, float]:
    """C keep-alive connections each sending back-to-back requests for `seconds` (after a warm-up).

    A minimal HTTP/1.1 client on asyncio streams (uvloop): the request bytes are built once and the
    response is read by Content-Length. A general client (aiohttp, httpx) costs several times more
    CPU per request, and the client's core must not be what limits the server. `on_start` is
    called when the measured part begins.
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
    if on_start:
        on_start()
    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker(started + seconds, True) for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    lat = np.array(latencies) * 1000
    return {
        "requests_per_s": len(latencies) / elapsed,
        "p50_ms": float(np.percentile(lat, 50)) if lat.size else float("nan"),  # every request failed: no latency
        "p99_ms": float(np.percentile(lat, 99)) if lat.size else float("nan"),
        "requests": len(latencies),
        "errors": errors,
        "client_cpu": (time.process_time() - cpu) / elapsed,
    }


def raw_sweep(model_path: Path, seconds: float) -> dict[str, dict[str, float]]:
    """The ceiling: session.run on a ready numpy batch, 1 intra-op thread (run pinned to one core)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    features = session.get_inputs()[0].shape[1]
    out = {}
    for batch in RAW_BATCHES:
        x = np.random.default_rng(0).standard_normal((batch, features)).astype(np.float32)
        for _ in range(3):
            session.run(None, {"x": x})
        runs, started, cpu = 0, time.perf_counter(), time.process_time()
        while time.perf_counter() - started < seconds:
            session.run(None, {"x": x})
            runs += 1
        elapsed = time.perf_counter() - started
        out[f"batch{batch}"] = {
            "rows_per_s": runs * batch / elapsed,
            "ms_per_run": elapsed / runs * 1000,
            "cpu": (time.process_time() - cpu) / elapsed,  # below 1: other work on the machine took the core
        }
    return out


def raw_one_core(model_path: Path, cpu: int, seconds: float) -> dict[str, Any]:
    """raw_sweep in a child process pinned to `cpu`; adds the best batch."""
    command = ["taskset", "-c", str(cpu), sys.executable, __file__, "--raw", str(model_path), "--seconds", str(seconds)]
    sweep = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    best = max(sweep, key=lambda k: sweep[k]["rows_per_s"])
    return {
        "sweep": sweep,
        "best_batch": int(best.removeprefix("batch")),
        "best_rows_per_s": sweep[best]["rows_per_s"],
        "best_rows_per_cpu_s": max(v["rows_per_s"] / v["cpu"] for v in sweep.values()),
    }


def batch_counters(port: int) -> tuple[float, float]:
    """(inference_count, execution_count) from pipe serve's /metrics (one worker's, when several)."""
    import httpx

    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    values = dict.fromkeys(("pipe_inference_count_total", "pipe_execution_count_total"), 0.0)  # none before a request
    for line in text.splitlines():
        for name in ("pipe_inference_count_total", "pipe_execution_count_total"):
            if line.startswith(name + "{"):
                values[name] = float(line.rsplit(" ", 1)[1])
    return values["pipe_inference_count_total"], values["pipe_execution_count_total"]


# -- the run ------------------------------------------------------------------------------------------


def build_models(workdir: Path) -> dict[str, Path]:
    from serve_models import mlp, write_artifact

    dirs = {}
    for name, sizes in MODELS.items():
        repo = workdir / name
        write_artifact(repo, "m", 1, mlp(sizes, seed=0))
        dirs[name] = repo / "m"
    return dirs


def cpu_seconds(proc: subprocess.Popen) -> float:
    """CPU time (user + system) used so far by a server and its worker processes."""
    import psutil

    root = psutil.Process(proc.pid)
    return sum(sum(p.cpu_times()[:2]) for p in (root, *root.children(recursive=True)))


def measure_cell(
    kind: str, proc: subprocess.Popen, port: int, encoding: str, c: int, x: np.ndarray, seconds: float
) -> dict[str, float]:
    """One load run; adds the server's CPU use (in cores) and, for pipe (either tree), its average batch."""
    url, body, headers = request_for(kind, encoding, port, x)
    before = batch_counters(port) if kind in PIPES else None
    mark: list[float] = []
    cell = uvloop.run(
        load(url, body, headers, c, seconds, lambda: mark.extend((cpu_seconds(proc), time.perf_counter())))
    )
    cell["server_cpu"] = (cpu_seconds(proc) - mark[0]) / (time.perf_counter() - mark[1])
    if before:
        after = batch_counters(port)
        cell["avg_batch"] = (after[0] - before[0]) / max(1.0, after[1] - before[1])
    return cell


def measure_model(model: str, model_dir: Path, workdir: Path, cpus: list[int], args: argparse.Namespace) -> dict:
    """Every server up at once; each round: the raw sweep, then every cell for each server in turn."""
    onnx_path = model_dir / "1" / "model.onnx"
    x = np.random.default_rng(1).standard_normal((1, MODELS[model][0])).astype(np.float32)
    rounds: list[dict[str, Any]] = []
    kinds = kinds_run(args)
    servers = {kind: start(kind, model_dir, cpus, workdir / f"{model}-{kind}.log", args.compare_tree) for kind in kinds}
    try:
        for r in range(args.repeats):
            measured: dict[str, Any] = {"raw": raw_one_core(onnx_path, cpus[0], min(1.0, args.seconds))}
            order = kinds[r % len(kinds) :] + kinds[: r % len(kinds)]
            for encoding in ("json", "binary"):
                for c in CONCURRENCY[model]:
                    for kind in order:
                        proc, port, _ = servers[kind]
                        cell = measure_cell(kind, proc, port, encoding, c, x, args.seconds)
                        measured.setdefault(kind, {})[f"{encoding}_c{c}"] = cell
            rounds.append(measured)
            print(f"{model} round {r + 1}/{args.repeats}: raw best batch {measured['raw']['best_batch']}", flush=True)
        profile = profile_pipe(servers["pipe"], x, args.profile) if args.profile else None
    finally:
        for proc, _, _ in servers.values():
            stop(proc)
    return {
        "sizes": MODELS[model],
        "commands": {kind: " ".join(command[1:]) for kind, (_, _, command) in servers.items()},
        "summary": summarize(rounds, len(cpus), kinds),
        "rounds": rounds,
        "profile": profile,
    }


def kinds_run(args: argparse.Namespace) -> tuple[str, ...]:
    return (*KINDS, BEFORE) if args.compare_tree else KINDS


def summarize(rounds: list[dict[str, Any]], server_cpus: int, kinds: tuple[str, ...]) -> dict[str, Any]:
    """Medians over rounds; every ratio is taken within a round first (same minute, same noise)."""

    def median(values: list[float]) -> float:
        return float(np.median(values))

    raw = {key: median([r["raw"]["sweep"][key]["rows_per_s"] for r in rounds]) for key in rounds[0]["raw"]["sweep"]}
    cells = {
        kind: {
            key: {stat: median([r[kind][key][stat] for r in rounds]) for stat in rounds[0][kind][key]}
            for key in rounds[0][kind]
        }
        for kind in kinds
    }
    ratios = {}
    for key in rounds[0]["pipe"]:
        for other in [k for k in kinds if k != "pipe"]:  # pipe/pipe-before last: the change measured
            ratios[f"{key} pipe/{other}"] = median(
                [r["pipe"][key]["requests_per_s"] / r[other][key]["requests_per_s"] for r in rounds]
            )
        if BEFORE in kinds:  # the same per CPU-second each got: other work on a shared machine takes a share
            ratios[f"{key} pipe/{BEFORE} per cpu-s"] = median(
                [r["pipe"][key]["requests_per_s"] / r["pipe"][key]["server_cpu"]
                 / (r[BEFORE][key]["requests_per_s"] / r[BEFORE][key]["server_cpu"]) for r in rounds]
            )  # fmt: skip
        # Server efficiency: rows/s served over what raw onnxruntime does on the same cores at its best
        # batch; and the same per CPU-second each really got (other work on the machine takes a share).
        for kind in ("pipe", "strong"):
            ratios[f"{key} {kind}/raw-best"] = median(
                [r[kind][key]["requests_per_s"] / (r["raw"]["best_rows_per_s"] * server_cpus) for r in rounds]
            )
            ratios[f"{key} {kind}/raw-best per cpu-s"] = median(
                [r[kind][key]["requests_per_s"] / r[kind][key]["server_cpu"] / r["raw"]["best_rows_per_cpu_s"]
                 for r in rounds]
            )  # fmt: skip
    best = collections.Counter(r["raw"]["best_batch"] for r in rounds).most_common(1)[0][0]
    return {"raw_rows_per_s": raw, "raw_best_batch": best, "cells": cells, "ratios": ratios}


# -- where pipe's time goes ---------------------------------------------------------------------------

DECODE = {"decode", "parse_json", "_inputs", "_outputs", "_object", "_parameters", "_shape", "_json_tensor",
          "json_array", "split_body", "decode_tensor", "_split_bytes"}  # fmt: skip
ENCODE = {"encode", "_json_data", "join_body", "encode_tensor", "json_text"}
# Each sample is charged to the first frame, from the innermost out, that one of these names.
# (category, path fragment, function names or None for any)
PROFILE_RULES = [
    ("onnxruntime run", "onnxruntime_inference_collection.py", None),
    ("batching: concatenate / split", "serve/batching.py", {"_execute"}),
    ("decode request", "serve/protocols/", DECODE),
    ("decode request", "serve/protocols/jsonvalues.py", None),  # JSON values -> typed arrays, range checks
    ("encode response", "serve/protocols/", ENCODE),
    ("check inputs", "serve/session.py", None),
    ("batching: queue, futures, timers", "serve/batching.py", None),
    ("app: routing, headers, body, metrics", "pipeline/serve/", None),
    ("uvicorn + httptools (HTTP parse, send)", "uvicorn/", None),
    ("thread pool hand-off", "concurrent/futures/", None),
    ("event loop (uvloop in C: socket reads, writes, callbacks)", "asyncio/", None),
]
FRAME = re.compile(r"^(?P<func>[^ ]+) \((?P<file>[^:)]+)")


def categorize(stack: list[str]) -> str | None:
    """The category of one sample; None for a pool thread waiting for work (idle, not CPU)."""
    if stack[-1].startswith("_worker (concurrent/futures/thread.py"):
        return None
    for frame in reversed(stack):
        m = FRAME.match(frame)
        if not m:
            continue
        for category, fragment, funcs in PROFILE_RULES:
            if fragment in m["file"] and (funcs is None or m["func"] in funcs):
                return category
    return "other (interpreter, GC, outside any rule)"


def profile_pipe(server: tuple[subprocess.Popen, int, list[str]], x: np.ndarray, seconds: float) -> dict:
    """py-spy samples pipe's workers under c=32 load; CPU samples (idle threads left out) by category."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        return {"error": "py-spy is not installed (pip install py-spy); no profile taken"}
    proc, port, _ = server
    out: dict[str, Any] = {}
    for encoding in ("json", "binary"):
        url, body, headers = request_for("pipe", encoding, port, x)
        with tempfile.NamedTemporaryFile(suffix=".txt") as raw:
            command = [spy, "record", "--pid", str(proc.pid), "--subprocesses", "--rate", "200", "--nonblocking",
                       "--duration", str(int(seconds)), "--format", "raw", "--output", raw.name]  # fmt: skip
            spying = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(0.5)
            cell = uvloop.run(load(url, body, headers, 32, seconds))
            spying.wait(60)
            totals: collections.Counter[str] = collections.Counter()
            for line in Path(raw.name).read_text().splitlines():
                stack, _, count = line.rpartition(" ")
                category = categorize(stack.split(";")) if stack and count.isdigit() else None
                if category:
                    totals[category] += int(count)
        samples = sum(totals.values())
        out[f"{encoding}_c32"] = {
            "requests_per_s_while_sampled": cell["requests_per_s"],
            "samples": samples,
            "share": {k: v / samples for k, v in totals.most_common()} if samples else {},
        }
    return out


# -- report -------------------------------------------------------------------------------------------


def report(results: dict[str, Any]) -> str:
    lines = [
        f"server CPUs {results['server_cpus']}, client CPUs {results['client_cpus']}; {results['repeats']} rounds "
        f"of {results['seconds_per_cell']:g} s per cell; medians over rounds; pipe at {results['pipe_commit'][:10]}"
    ]
    if "compare_tree" in results:
        lines.append(f"pipe-before: {results['compare_tree']} at {results['compare_commit'][:10]}")
    for model, entry in results["models"].items():
        s = entry["summary"]
        lines.append(f"\n{model} MLP {entry['sizes']}")
        sweep = "  ".join(f"b{k.removeprefix('batch')} {v:,.0f}" for k, v in s["raw_rows_per_s"].items())
        lines.append(f"  raw onnxruntime, one core, rows/s: {sweep}  (best batch {s['raw_best_batch']})")
        columns = ("req/s", "p50 ms", "p99 ms", "batch", "server cpu", "client cpu", "errors")
        lines.append(f"  {'cell':11} {'server':11} " + " ".join(f"{c:>{max(6, len(c))}}" for c in columns))
        for key in s["cells"]["pipe"]:
            for kind in s["cells"]:
                c = s["cells"][kind][key]
                batch = f"{c['avg_batch']:6.1f}" if "avg_batch" in c else " " * 6
                lines.append(f"  {key:11} {kind:11} {c['requests_per_s']:6.0f} {c['p50_ms']:6.2f} {c['p99_ms']:6.2f} "
                             f"{batch} {c['server_cpu']:10.2f} {c['client_cpu']:10.2f} {c['errors']:6.0f}")  # fmt: skip
    lines.append("\nratios (within each round, median over rounds):")
    for model, entry in results["models"].items():
        for key, value in entry["summary"]["ratios"].items():
            lines.append(f"  {model} {key:38} {value:6.2f}")
    lines.append("\ngoals:")
    for goal in results["goals"]:
        verdict = "MET" if goal["met"] else "MISSED"
        lines.append(f"  {goal['what']:58} {goal['value']:5.2f}  goal >= {goal['goal']}  {verdict}")
    for model, entry in results["models"].items():
        for case, p in (entry.get("profile") or {}).items():
            if "share" not in p:
                lines.append(f"\nprofile: {p}")
                continue
            lines.append(f"\nwhere pipe's CPU time goes, {model} {case} ({p['samples']} py-spy samples, "
                         f"{p['requests_per_s_while_sampled']:.0f} req/s while sampled):")  # fmt: skip
            lines += [f"  {share * 100:5.1f}%  {category}" for category, share in p["share"].items()]
    return "\n".join(lines)


def goals(models: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's two goals, each where this run measured it."""
    out = []
    for encoding in ("json", "binary") if "small" in models else ():
        value = models["small"]["summary"]["ratios"][f"{encoding}_c32 pipe/strong"]
        out.append({"what": f"small {encoding} c=32: pipe / strong FastAPI, req/s", "value": value, "goal": 1.5})
    for c in CONCURRENCY["heavy"][2:] if "heavy" in models else ():
        for encoding in ("json", "binary"):
            ratios = models["heavy"]["summary"]["ratios"]
            out.append({"what": f"heavy {encoding} c={c}: pipe / raw one-core best batch, rows/s",
                        "value": ratios[f"{encoding}_c{c} pipe/raw-best"], "goal": 0.8})  # fmt: skip
            out.append({"what": f"heavy {encoding} c={c}: the same per CPU-second used",
                        "value": ratios[f"{encoding}_c{c} pipe/raw-best per cpu-s"], "goal": 0.8})  # fmt: skip
    for goal in out:
        goal["met"] = goal["value"] >= goal["goal"]
    return out


def split_cpus(server: str | None, client: str | None) -> tuple[list[int], list[int]]:
    """Server and client CPU lists; by default the first half of this process's CPUs serve."""
    available = sorted(os.sched_getaffinity(0))
    if len(available) < 2 and not (server and client):
        raise SystemExit(f"need at least 2 CPUs to pin server and client apart; this process has {available}")
    half = max(1, len(available) // 2)
    parse = lambda text: [int(c) for c in text.split(",")]  # noqa: E731
    return (parse(server) if server else available[:half]), (parse(client) if client else available[half:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="measured seconds per cell")
    parser.add_argument("--repeats", type=int, default=3, help="rounds per cell; the median is reported")
    parser.add_argument("--profile", type=float, default=0, help="seconds of py-spy sampling per case (0: none)")
    parser.add_argument("--server-cpus", help="comma-separated CPUs for the servers (default: first half)")
    parser.add_argument("--client-cpus", help="comma-separated CPUs for the load generator (default: the rest)")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated, of: " + ", ".join(MODELS))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "serve.json")
    parser.add_argument("--compare-tree", type=Path, help="also run pipe serve from this source tree (pipe-before)")
    parser.add_argument("--raw", help=argparse.SUPPRESS)  # internal: the raw sweep of this model, as JSON
    args = parser.parse_args()
    if args.raw:
        print(json.dumps(raw_sweep(Path(args.raw), args.seconds)))
        return

    if args.compare_tree and not (args.compare_tree / "pipeline" / "__init__.py").is_file():
        raise SystemExit(
            f"--compare-tree {args.compare_tree}: no pipeline/__init__.py there; give a source tree of pipe"
        )
    server_cpus, client_cpus = split_cpus(args.server_cpus, args.client_cpus)
    os.sched_setaffinity(0, client_cpus)  # the load generator; servers and the raw sweep are pinned by taskset
    git = lambda *a, cwd=ROOT: subprocess.run(["git", *a], capture_output=True, text=True, cwd=cwd).stdout  # noqa: E731
    head, changed = git("rev-parse", "HEAD").strip(), git("status", "--porcelain", "pipeline/serve")
    results: dict[str, Any] = {
        "pipe_commit": head or "unknown (not a git checkout)",
        "pipe_serve_uncommitted": changed.splitlines(),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_avg": os.getloadavg()},
        "server_cpus": server_cpus,
        "client_cpus": client_cpus,
        "seconds_per_cell": args.seconds,
        "repeats": args.repeats,
        "models": {},
    }
    if args.compare_tree:
        args.compare_tree = args.compare_tree.resolve()
        results["compare_tree"] = str(args.compare_tree)
        results["compare_commit"] = git("rev-parse", "HEAD", cwd=args.compare_tree).strip() or "unknown"
        results["compare_serve_uncommitted"] = git(
            "status", "--porcelain", "pipeline/serve", cwd=args.compare_tree
        ).splitlines()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        # Which `pipeline` each pipe server imports: with --compare-tree, one from each tree.
        results["pipeline_imported"] = {
            kind: pipeline_imported(kind, workdir, args.compare_tree) for kind in PIPES if kind in kinds_run(args)
        }
        if args.compare_tree and len(set(results["pipeline_imported"].values())) < 2:
            raise SystemExit(f"pipe and pipe-before would import the same package: {results['pipeline_imported']}")
        for model, model_dir in build_models(workdir).items():
            if model not in args.models.split(","):
                continue
            results["models"][model] = measure_model(model, model_dir, workdir, server_cpus, args)
    results["machine"]["load_avg_after"] = os.getloadavg()
    results["goals"] = goals(results["models"])
    text = report(results)
    print("\n" + text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    args.out.with_suffix(".txt").write_text(text + "\n")
    print(f"\nwrote {args.out} and {args.out.with_suffix('.txt')}")


if __name__ == "__main__":
    main()
