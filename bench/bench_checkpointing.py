"""Benchmark gradient checkpointing on the zoo's transformer and MoE: same loss, less activation memory.

    .venv/bin/python bench/bench_checkpointing.py [--out bench/results/checkpointing.json]

For each architecture (transformer, moe; d_model 128, 4 layers, batch 32 x 128 tokens), with and
without `grad_checkpointing`, side by side in one run:
  - loss: 5 AdamW steps from the same initial weights, data and dropout seed; the largest absolute
    difference between the two loss curves (checkpointing recomputes the same arithmetic, so it
    should be ~0);
  - saved activations: the bytes autograd keeps for the backward pass after the forward pass,
    counted with torch.autograd.graph.saved_tensors_hooks (checkpointed blocks keep only their
    inputs, and recompute the rest in backward);
  - peak memory: the peak RSS (Linux VmHWM, reset just before) of a fresh process doing one
    forward + backward, minus its RSS before the forward: what the allocator really took, on CPU,
    including the backward pass's own temporaries and the recomputed block;
  - time: forward + backward seconds (the price: blocks run their forward twice).
Ratios (with / without) are printed and written as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHAPE = {"d_model": 128, "heads": 4, "layers": 4, "ff_mult": 4, "max_len": 128, "dropout": 0.1}
BATCH, LENGTH, VOCAB, CLASSES = 32, 128, 64, 4


def build(arch: str, checkpointing: bool) -> Any:
    import torch

    from pipeline.data import DataInfo
    from pipeline.recipe.schema import parse_recipe
    from pipeline.train.zoo import build_model

    extra = {"experts": 4, "top_k": 2} if arch == "moe" else {}
    spec = parse_recipe({"name": "b", "model": {"arch": arch, **SHAPE, **extra}, "data": {"source": "digits"}}).model
    torch.manual_seed(0)
    model = build_model(spec, DataInfo("tokens", [LENGTH], CLASSES, vocab_size=VOCAB))
    model.grad_checkpointing = checkpointing
    return model.train()


def batch() -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(1)
    return torch.randint(1, VOCAB, (BATCH, LENGTH), generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g)


def loss_curve(arch: str, checkpointing: bool, steps: int = 5) -> list[float]:
    import torch
    from torch.nn import functional as F

    model = build(arch, checkpointing)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens, target = batch()
    torch.manual_seed(2)  # the same dropout masks on both sides
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(tokens), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def saved_bytes_and_time(arch: str, checkpointing: bool) -> tuple[int, float]:
    """Bytes held for backward right after the forward pass, and one forward + backward's seconds."""
    import torch
    from torch.nn import functional as F

    model = build(arch, checkpointing)
    tokens, target = batch()
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.device.type == "cpu" and not isinstance(t, torch.nn.Parameter):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = F.cross_entropy(model(tokens), target)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    held = sum(n for ptr, n in storages.items() if ptr not in params)
    loss.backward()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        F.cross_entropy(model(tokens), target).backward()
        times.append(time.perf_counter() - start)
    return held, min(times)


PEAK = """
import sys, psutil
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from bench_checkpointing import build, batch
from torch.nn import functional as F

def high_water():  # VmHWM: this process's peak RSS (ru_maxrss would include the parent's, kept across exec)
    line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmHWM"))
    return int(line.split()[1]) * 1024

model = build(sys.argv[1], sys.argv[2] == "1")
tokens, target = batch()
F.cross_entropy(model(tokens[:2]), target[:2]).backward()  # warm up allocator and kernels
model.zero_grad()
Path("/proc/self/clear_refs").write_text("5")  # reset the high-water mark to the current RSS
before = psutil.Process().memory_info().rss
F.cross_entropy(model(tokens), target).backward()
print(high_water() - before)
"""


def peak_rss_delta(arch: str, checkpointing: bool) -> int:
    # a fixed mmap threshold: large tensors are mapped and unmapped, so RSS follows live memory
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run([sys.executable, "-c", PEAK, arch, "1" if checkpointing else "0", str(ROOT / "bench")],
                         capture_output=True, text=True, check=True, env=env)  # fmt: skip
    return int(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "checkpointing.json")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    results: dict[str, Any] = {
        "benchmark": "gradient checkpointing",
        "shape": {**SHAPE, "batch": BATCH, "sequence": LENGTH},
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count()},
        "models": {},
    }
    for arch in ("transformer", "moe"):
        row: dict[str, Any] = {}
        for ckpt in (False, True):
            held, seconds = saved_bytes_and_time(arch, ckpt)
            row["with" if ckpt else "without"] = {
                "losses": loss_curve(arch, ckpt),
                "saved_activation_bytes": held,
                "peak_rss_delta_bytes": peak_rss_delta(arch, ckpt),
                "fwd_bwd_s": seconds,
            }
        a, b = row["without"], row["with"]
        row["max_loss_diff"] = max(abs(x - y) for x, y in zip(a["losses"], b["losses"], strict=True))
        row["saved_activation_ratio"] = b["saved_activation_bytes"] / a["saved_activation_bytes"]
        row["peak_rss_ratio"] = b["peak_rss_delta_bytes"] / max(a["peak_rss_delta_bytes"], 1)
        row["time_ratio"] = b["fwd_bwd_s"] / a["fwd_bwd_s"]
        results["models"][arch] = row
        print(f"{arch}: max |loss diff| {row['max_loss_diff']:.2e} over 5 steps; saved activations "
              f"{a['saved_activation_bytes'] / 2**20:.1f} -> {b['saved_activation_bytes'] / 2**20:.1f} MiB "
              f"(x{row['saved_activation_ratio']:.2f}); peak RSS growth {a['peak_rss_delta_bytes'] / 2**20:.1f} -> "
              f"{b['peak_rss_delta_bytes'] / 2**20:.1f} MiB (x{row['peak_rss_ratio']:.2f}); "
              f"fwd+bwd time x{row['time_ratio']:.2f}")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
