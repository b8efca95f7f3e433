"""Benchmark `pipe optimize --quantize auto` on a real-layout conv classifier: time, memory, and what it keeps.

    .venv/bin/python bench/bench_optimize_cnn.py [--samples 256] [--before PATH] [--out bench/results/optimize_cnn.json]

Issue 17 measured the auto search on a real PP-LCNet (6.8 MB, 224x224): 13.5 minutes and 11.6 GB
peak on this 2-core machine, every candidate dynamic int8 and 8x slower than fp32. This builds a
model of the same kind offline: MobileNetV3-small's layout (torchvision's table of inverted
residual blocks: depthwise convs, hard-swish, squeeze-excite, written out below; no download, no
torchvision), 1.5 M parameters (6.3 MB), random weights, its batch-norm statistics set on the
data and its classifier head fitted (a "briefly fit" model: the backbone stays random), exported
with torch's dynamo exporter with a dynamic batch. The data: 4 classes, each a smooth colour
pattern at 224x224 plus pixel noise; 256 samples to fit on, another 256 (with labels) given to
`pipe import --eval-data` as an NPZ.

Then `pipe optimize ARTIFACT --quantize auto` runs as a user runs it (a child process): its wall
time, its peak resident memory (the child's own ru_maxrss, and the figure pipe reports), the
variant it kept, that variant's speed and size against model.onnx (timed side by side by the
stage), and the search's note. `--before PATH` runs the same command with another checkout of pipe
(e.g. /work/main before this change) on a copy of the artifact, for the figures to compare.

Results: printed, bench/results/optimize_cnn.json, and a copy of the printed lines in .txt.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CLASSES, SIZE = 4, 224
GOAL_SECONDS, GOAL_BYTES = 180.0, 3 * 2**30  # issue 17: under 3 minutes, under 3 GB peak RSS
# MobileNetV3-small (Howard et al. 2019, table 2; torchvision's mobilenet_v3_small): per block the kernel,
# expanded channels, output channels, squeeze-excite, hard-swish (else ReLU), stride
SMALL = [(3, 16, 16, 1, 0, 2), (3, 72, 24, 0, 0, 2), (3, 88, 24, 0, 0, 1), (5, 96, 40, 1, 1, 2), (5, 240, 40, 1, 1, 1),
         (5, 240, 40, 1, 1, 1), (5, 120, 48, 1, 1, 1), (5, 144, 48, 1, 1, 1), (5, 288, 96, 1, 1, 2),
         (5, 576, 96, 1, 1, 1), (5, 576, 96, 1, 1, 1)]  # fmt: skip


def mobilenet_v3_small(classes: int) -> Any:
    """MobileNetV3-small's layout as torch modules (conv + batch norm + activation, inverted residuals, SE)."""
    from torch import nn

    def conv(cin: int, cout: int, k: int, stride: int, groups: int, act: type[nn.Module] | None) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False), nn.BatchNorm2d(cout),
                *([act()] if act else [])]  # fmt: skip

    class SqueezeExcite(nn.Module):
        def __init__(self, channels: int) -> None:
            super().__init__()
            squeezed = max(8, (channels // 4 + 4) // 8 * 8)
            self.fc1, self.fc2 = nn.Conv2d(channels, squeezed, 1), nn.Conv2d(squeezed, channels, 1)

        def forward(self, x: Any) -> Any:
            scale = nn.functional.adaptive_avg_pool2d(x, 1)
            return x * nn.functional.hardsigmoid(self.fc2(nn.functional.relu(self.fc1(scale))))

    class Block(nn.Module):
        def __init__(self, cin: int, k: int, expanded: int, cout: int, se: int, hs: int, stride: int) -> None:
            super().__init__()
            act = nn.Hardswish if hs else nn.ReLU
            layers = conv(cin, expanded, 1, 1, 1, act) if expanded != cin else []
            layers += conv(expanded, expanded, k, stride, expanded, act)  # depthwise
            layers += [SqueezeExcite(expanded)] if se else []
            layers += conv(expanded, cout, 1, 1, 1, None)
            self.body, self.residual = nn.Sequential(*layers), stride == 1 and cin == cout

        def forward(self, x: Any) -> Any:
            return x + self.body(x) if self.residual else self.body(x)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            layers, channels = conv(3, 16, 3, 2, 1, nn.Hardswish), 16
            for k, expanded, cout, se, hs, stride in SMALL:
                layers.append(Block(channels, k, expanded, cout, se, hs, stride))
                channels = cout
            self.features = nn.Sequential(*layers, *conv(channels, 576, 1, 1, 1, nn.Hardswish))
            self.head = nn.Sequential(nn.Linear(576, 1024), nn.Hardswish(), nn.Linear(1024, classes))

        def forward(self, x: Any) -> Any:
            return self.head(self.features(x).mean((2, 3)))

    return Net()


def pictures(count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """`count` pictures [N, 3, 224, 224] and their classes: a colour cast and a smooth pattern per class, plus noise."""
    import torch

    classes = np.random.default_rng(7)
    low = classes.standard_normal((CLASSES, 3, 4, 4)).astype(np.float32)
    patterns = torch.nn.functional.interpolate(torch.from_numpy(low), size=SIZE, mode="bilinear").numpy()
    patterns += classes.standard_normal((CLASSES, 3, 1, 1)).astype(np.float32)
    label = rng.integers(0, CLASSES, count)
    noise = rng.standard_normal((count, 3, SIZE, SIZE)).astype(np.float32)
    return (patterns[label] + noise).astype(np.float32), label


def build(directory: Path, samples: int, out: Any) -> tuple[Path, Path, float]:
    """The fitted net as ONNX and the eval NPZ: (model, data, fp32 accuracy on the eval data)."""
    import warnings

    import torch
    from torch import nn

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    net = mobilenet_v3_small(CLASSES)
    fit_x, fit_y = pictures(samples, rng)
    eval_x, eval_y = pictures(samples, rng)
    start = time.perf_counter()
    for module in net.modules():  # batch-norm statistics: the data's own (a cumulative average)
        if isinstance(module, nn.BatchNorm2d):
            module.momentum = None
    net.train()
    with torch.no_grad():
        for i in range(0, min(samples, 128), 32):
            net.features(torch.from_numpy(fit_x[i : i + 32]))
    net.eval()
    with torch.no_grad():
        feats = torch.cat(
            [net.features(torch.from_numpy(fit_x[i : i + 32])).mean((2, 3)) for i in range(0, samples, 32)]
        )
    optimizer = torch.optim.AdamW(net.head.parameters(), 3e-3, weight_decay=0.05)
    for _ in range(100):  # the head only: a few seconds
        loss = nn.functional.cross_entropy(net.head(feats), torch.from_numpy(fit_y))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        logits = torch.cat([net(torch.from_numpy(eval_x[i : i + 32])) for i in range(0, samples, 32)]).numpy()
    accuracy = float((logits.argmax(1) == eval_y).mean())
    model, data = directory / "mobilenet_v3_small.onnx", directory / "eval.npz"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.from_numpy(eval_x[:1]),), str(model), dynamo=True, external_data=False,
                          input_names=["image"], output_names=["logits"], verbose=False,
                          dynamic_shapes=({0: torch.export.Dim("batch")},))  # fmt: skip
    np.savez(data, image=eval_x, target=eval_y)
    params = sum(p.numel() for p in net.parameters())
    out(f"built {model.name}: {params / 1e6:.2f} M parameters, {model.stat().st_size / 2**20:.2f} MiB; fp32 accuracy "
        f"{accuracy:.4f} on {samples} held-out samples; fitted in {time.perf_counter() - start:.0f} s")  # fmt: skip
    return model, data, accuracy


PIXEL_STD = 24.0  # a sample x is written as the pixel 128 + 24 x (clipped to 0..255): |x| up to 5.3 fits


def picture_folder(data: Path, directory: Path) -> tuple[Path, list[str]]:
    """The eval samples as PNG pictures in one folder per class (ImageFolder layout), and the
    `pipe import` options that read them back: labels by folder name and the pixel -> sample record."""
    from PIL import Image

    arrays = np.load(data)
    folder, labels = directory / "pictures", [f"class{k}" for k in range(CLASSES)]
    for i, (x, y) in enumerate(zip(arrays["image"], arrays["target"], strict=True)):
        pixels = np.clip(np.rint(128 + PIXEL_STD * x.transpose(1, 2, 0)), 0, 255).astype(np.uint8)
        (folder / labels[y]).mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels, "RGB").save(folder / labels[y] / f"{i:04d}.png")
    record = {"mode": "RGB", "size": [SIZE, SIZE], "scale": 1.0, "mean": [128.0] * 3, "std": [PIXEL_STD] * 3}
    return folder, ["--labels", ",".join(labels), "--image-preprocessing", json.dumps(record)]


def run_pipe(tree: Path, args: list[str]) -> tuple[str, float, int]:
    """`pipe ARGS` with the code of `tree`, as a child process: (output, wall seconds, its peak RSS in bytes)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "CI": "true"}
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "pipeline", *args], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env=env, cwd=tree)  # fmt: skip
    output = child.stdout.read() if child.stdout else ""
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status):
        raise RuntimeError(f"pipe {' '.join(args)} failed:\n{output}")
    return output, seconds, usage.ru_maxrss * 1024  # Linux: kilobytes


def optimize(tree: Path, root: Path, label: str, out: Any) -> dict[str, Any]:
    """`pipe optimize ROOT --quantize auto` with `tree`'s code: the figures issue 17 asks for."""
    command = ["optimize", str(root), "--quantize", "auto"]
    output, seconds, peak = run_pipe(tree, command)
    report = json.loads((root / "reports" / "optimize.json").read_text())
    manifest = json.loads((root / "manifest.json").read_text())
    int8 = next(v for v in report["variants"] if v["variant"] == "int8")
    search = int8["details"]["search"]
    fp32_size = report["fp32"]["size"]
    size = manifest["files"][int8["file"]]["size"]
    row = {
        "label": label,
        "command": "pipe " + " ".join(command),
        "seconds": round(seconds, 1),
        "peak_rss_bytes": peak,
        "reported": report.get("resources"),
        "kept": search["chosen"],
        "status": int8["status"],
        "detail": int8["detail"],
        "size_ratio": round(size / fp32_size, 3),
        "speedup_b1": int8.get("speedup_b1"),
        "speedup_b32": int8.get("speedup_b32"),
        "candidates": [_candidate(report, t) for t in search["tried"]],
        "speed": search.get("speed"),
        "note": int8.get("note") or manifest["variants"]["int8"].get("note"),
        "notes": search.get("notes", []),
        "calibrations": search.get("calibrations"),
    }
    out(f"{label}: pipe optimize --quantize auto: {seconds:.1f} s, peak RSS {peak / 2**30:.2f} GiB; kept "
        f"{row['kept']} ({row['status']}): {row['size_ratio']:.2f}x the size, "
        f"{_x(row['speedup_b1'])} fp32's speed at batch 1 (stage timing)")  # fmt: skip
    for trial in row["candidates"]:
        verdict = "passed" if trial["passed"] else "failed"
        out(f"  tried {trial['name']}: {verdict}, {_x(trial['speedup_b1'])} fp32's speed at batch 1")
    for note in row["notes"]:
        out(f"  search: {note}")
    if row["note"]:
        out(f"  note: {row['note']}")
    out(f"  output tail: {output.strip().splitlines()[-3:]}")
    return row


def _candidate(report: dict[str, Any], trial: dict[str, Any]) -> dict[str, Any]:
    """One candidate the search tried: its name, verdict and speed against the fp32 timed beside it (an older
    pipe timed every candidate in one run: fp32's p50 from that run over the candidate's)."""
    speedup = trial.get("speedup_b1")
    if speedup is None:
        search = next(v for v in report["variants"] if v["variant"] == "int8")["details"]["search"]
        reference = (search.get("reference_latency") or {}).get("p50_ms_b1")
        mine = (trial.get("latency") or {}).get("p50_ms_b1")
        speedup = reference / mine if reference and mine else None
    return {"name": trial["name"], "passed": trial["verdict"]["passed"], "speedup_b1": speedup}


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=256, help="pictures to fit on, and as many to import")
    parser.add_argument("--before", type=Path, default=None, help="another checkout of pipe to compare with")
    parser.add_argument("--pictures", action="store_true", help="import a folder of PNG pictures, not the NPZ")
    parser.add_argument("--out", type=Path, default=None, help="[bench/results/optimize_cnn(_pictures).json]")
    args = parser.parse_args()
    if args.pictures and args.before is not None:
        parser.error("--pictures and --before do not go together: the code before issue 17 imports no picture folder")
    name = "optimize_cnn_pictures.json" if args.pictures else "optimize_cnn.json"
    args.out = args.out or ROOT / "bench" / "results" / name
    lines: list[str] = []

    def out(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    out(f"bench_optimize_cnn on {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"python {platform.python_version()}")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-optimize-cnn-") as tmp:
        directory = Path(tmp)
        model, data, accuracy = build(directory, args.samples, out)
        repo, extra = directory / "artifacts", []
        if args.pictures:
            data, extra = picture_folder(data, directory)
            out(f"eval data: {args.samples} PNG pictures in {CLASSES} class folders, imported with --eval-data DIR")
        output, _, _ = run_pipe(ROOT, ["import", str(model), "--name", "mobilenet", "--eval-data", str(data),
                                       "--repository", str(repo), *extra])  # fmt: skip
        out(f"  import: {output.strip().splitlines()[0] if output.strip() else ''}")
        root = repo / "mobilenet" / "1"
        rows = []
        if args.before is not None:  # imported by that checkout too: its manifest is the one it reads
            tree = args.before.resolve()
            run_pipe(tree, ["import", str(model), "--name", "mobilenet", "--eval-data", str(data), "--repository",
                            str(directory / "before")])  # fmt: skip
            rows.append(optimize(tree, directory / "before" / "mobilenet" / "1", f"before ({args.before})", out))
        rows.append(optimize(ROOT, root, "this tree", out))
    now = rows[-1]
    faster = now["speed"] == "faster" and now["status"] == "passed"
    kept_ok = faster or (now["status"] == "passed" and bool(now["note"]) and "faster on this CPU" in now["note"])
    goals = [
        ("wall time", f"{now['seconds']:.1f} s", f"< {GOAL_SECONDS:.0f} s", now["seconds"] < GOAL_SECONDS),
        ("peak RSS", f"{now['peak_rss_bytes'] / 2**30:.2f} GiB", "< 3 GiB", now["peak_rss_bytes"] < GOAL_BYTES),
        ("kept", f"{now['kept']}: {_x(now['speedup_b1'])} speed, {now['size_ratio']:.2f}x size",
         "passed static int8 faster than fp32, or the smallest passed one with the op-profile reason", kept_ok),
    ]  # fmt: skip
    out()
    for figure, value, goal, met in goals:
        out(f"{'MET ' if met else 'MISSED'} {figure}: {value} (goal {goal})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {"fp32_accuracy": accuracy, "samples": args.samples, "runs": rows,
              "goals": [{"figure": f, "value": v, "goal": g, "met": m} for f, v, g, m in goals]}  # fmt: skip
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    args.out.with_suffix(".txt").write_text("\n".join(lines) + "\n")
    out(f"wrote {args.out} and {args.out.with_suffix('.txt')}")


if __name__ == "__main__":
    main()
