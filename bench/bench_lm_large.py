"""A random-init causal LM over 2 GB through every hop: `pipe import`, `pipe optimize`, a tampered byte refused,
and `pipe serve` loading it, each a real command timed with `/usr/bin/time -v` (wall time, peak memory).

    .venv/bin/python bench/bench_lm_large.py [--work DIR] [--phases make,import,optimize,tamper,serve]
                                             [--quantize auto] [--hidden 1536] [--layers 20]

A Llama of about 600 M parameters (2.4 GB in fp32: past protobuf's 2 GiB, so its weights go to
`model.onnx.data`) is made from a config with random weights and saved with save_pretrained (`make`), then
each command runs as its own process, as a user runs it: `import` (the dynamo export with external data and
the gate on greedy generation against transformers at batch 1, 2 and 4), `optimize` (the variants of
`--quantize`, each with its external data written beside it and hashed), `tamper` (one byte of the copied
`model.onnx.data` changed: the verified load must refuse it, naming the file), `serve` (`pipe serve` on the
repository until `/v2/health/ready` answers 200, then stopped). Peak memory is `/usr/bin/time`'s maximum
resident set of the command. With `--work DIR` the directory is kept and a phase whose output is already
there is not run again (the import takes minutes). Never run by the test suite; random weights judge parity
only (quantization is judged on a trained model: bench_lm.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
PHASES = ("make", "import", "optimize", "tamper", "serve")
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}  # one torch/onnxruntime thread


def timed(command: list[str], log: Path) -> dict[str, object]:
    """Run `command` under /usr/bin/time -v; its wall seconds, peak resident GB and exit status."""
    with open(log, "w") as out:
        done = subprocess.run(["/usr/bin/time", "-v", *command], stdout=out, stderr=subprocess.STDOUT, env=ENV)
    return {**_time_report(log.read_text()), "rc": done.returncode, "log": str(log)}


def _time_report(text: str) -> dict[str, float]:
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", text)
    seconds = 0.0
    for part in wall.group(1).split(":") if wall else []:
        seconds = seconds * 60 + float(part)
    return {"wall_s": round(seconds, 1), "peak_gb": round(int(peak.group(1)) / 1024**2, 2) if peak else -1.0}


def make(source: Path, hidden: int, layers: int) -> dict[str, object]:
    """The random-init Llama saved with save_pretrained, in a child process (its memory is not the import's)."""
    code = f"""
import torch, sys
sys.path.insert(0, {str(ROOT)!r})
from pathlib import Path
from transformers import LlamaConfig, LlamaForCausalLM
from tests.lm.lm_models import save_bpe_tokenizer
torch.set_num_threads(1)
source = save_bpe_tokenizer(Path({str(source)!r}))
config = LlamaConfig(vocab_size=32000, hidden_size={hidden}, intermediate_size={hidden * 8 // 3},
                     num_hidden_layers={layers}, num_attention_heads=12, num_key_value_heads=4,
                     max_position_embeddings=2048, pad_token_id=0, bos_token_id=1, eos_token_id=2)
torch.manual_seed(0)
model = LlamaForCausalLM(config).eval()
print("parameters", sum(p.numel() for p in model.parameters()))
model.save_pretrained(source)
"""
    result = timed([PYTHON, "-c", code], source.parent / "make.log")
    found = re.search(r"parameters (\d+)", (source.parent / "make.log").read_text())
    return {**result, "parameters": int(found.group(1)) if found else None}


def serve(repository: Path, log: Path) -> dict[str, object]:
    """`pipe serve REPOSITORY` until /v2/health/ready answers 200 (seconds to ready), then stopped (SIGINT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [PYTHON, "-m", "pipeline", "serve", str(repository), "--host", "127.0.0.1", "--port", str(port)]
    out = open(log, "w")
    began = time.perf_counter()
    child = subprocess.Popen(["/usr/bin/time", "-v", *command], stdout=out, stderr=subprocess.STDOUT, env=ENV)
    ready, status = None, None
    try:
        while time.perf_counter() - began < 900 and child.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=5) as answer:
                    status = answer.status
            except OSError as exc:
                status = getattr(exc, "code", None)
            if status == 200:
                ready = round(time.perf_counter() - began, 1)
                break
            time.sleep(1)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/big", timeout=30) as answer:
            metadata = json.loads(answer.read())
    except OSError as exc:
        metadata = {"error": str(exc)}
    finally:
        import psutil

        for server in psutil.Process(child.pid).children():  # /usr/bin/time does not pass SIGINT on: the server
            os.kill(server.pid, signal.SIGINT)  # drains and exits, and time then reports its peak memory
        child.wait(timeout=300)
        out.close()
    report = _time_report(log.read_text())
    return {"ready_s": ready, "peak_gb": report["peak_gb"], "versions": metadata.get("versions"),
            "rc": child.returncode, "log": str(log)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=None, help="kept work directory (default: a temporary one)")
    parser.add_argument("--phases", default=",".join(PHASES))
    parser.add_argument("--quantize", action="append", default=None, help="pipe optimize --quantize (repeatable)")
    parser.add_argument("--graph", default="none", help="pipe optimize --graph (opt of a 2.4 GB model: minutes)")
    parser.add_argument("--hidden", type=int, default=1536)
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "lm_large.json")
    args = parser.parse_args()
    phases = args.phases.split(",")
    work = args.work or Path(tempfile.mkdtemp(prefix="pipe-lm-large-"))
    work.mkdir(parents=True, exist_ok=True)
    source, repository = work / "src", work / "artifacts"
    version = repository / "big" / "1"
    state = work / "results.json"  # the phases run so far in this work directory
    out: dict[str, object] = json.loads(state.read_text()) if state.exists() else {}
    out["host"] = {"cpus": os.cpu_count(), "threads": 1}
    if "make" in phases and not (source / "config.json").exists():
        out["make"] = make(source, args.hidden, args.layers)
        print("make", out["make"])
    if "import" in phases and not (version / "manifest.json").exists():
        out["import"] = timed([PYTHON, "-m", "pipeline", "import", str(source), "--name", "big",
                               "--repository", str(repository)], work / "import.log")  # fmt: skip
        print("import", out["import"])
    manifest = json.loads((version / "manifest.json").read_text())
    out["files"] = {k: v["size"] for k, v in manifest["files"].items() if k.endswith((".onnx", ".data"))}
    rows = manifest["stages"]["import"]["parity"]["rows"]
    out["gate"] = {"passed": all(r["passed"] for r in rows), "checks": len(rows),
                   "max_logit_abs": max(r["max_abs"] or 0.0 for r in rows if r["output"] == "logits")}  # fmt: skip
    if "optimize" in phases:
        command = [PYTHON, "-m", "pipeline", "optimize", str(version), "--graph", args.graph]
        for kind in args.quantize or ["auto"]:
            command += ["--quantize", kind]
        out["optimize"] = timed(command, work / "optimize.log")
        manifest = json.loads((version / "manifest.json").read_text())
        out["variants"] = {name: {"status": v["status"], "size": v["size"], "reason": v["reason"][:300]}
                           for name, v in manifest["variants"].items()}  # fmt: skip
        out["files"] = {k: v["size"] for k, v in manifest["files"].items() if k.endswith((".onnx", ".data"))}
        print("optimize", out["optimize"], out["variants"])
    report = version / "reports" / "optimize.json"
    if report.exists():  # what pipe optimize measured: each variant's size, verdict and tokens/s beside fp32's
        made = json.loads(report.read_text())
        out["speeds"] = {"fp32": {"size": made["fp32"]["size"], **made["fp32"]["latency"]}}
        for row in made["variants"]:
            out["speeds"][row["variant"]] = {"size": row["size"], "status": row["status"], "detail": row["detail"],
                                             **(row["latency"] or {})}  # fmt: skip
    if "tamper" in phases:
        copy = work / "tampered" / "big" / "1"
        shutil.rmtree(copy.parent.parent, ignore_errors=True)
        shutil.copytree(version, copy)
        with open(copy / "model.onnx.data", "r+b") as f:
            f.seek(1 << 20)
            byte = f.read(1)
            f.seek(1 << 20)
            f.write(bytes([byte[0] ^ 1]))
        out["tamper"] = timed([PYTHON, "-m", "pipeline", "info", str(copy)], work / "tamper.log")
        out["tamper"]["said"] = [line for line in (work / "tamper.log").read_text().splitlines() if "sha256" in line]
        shutil.rmtree(copy.parent.parent)
        print("tamper", out["tamper"])
    if "serve" in phases:
        out["serve"] = serve(repository, work / "serve.log")
        print("serve", out["serve"])
    state.write_text(json.dumps(out, indent=2) + "\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out} (work directory {work})")


if __name__ == "__main__":
    main()
