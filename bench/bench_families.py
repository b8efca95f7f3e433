"""Every decoder family through import and serve, past its sliding window: the family table.

    .venv/bin/python bench/bench_families.py [--families llama,mistral,...] [--json bench/results/families.json]

For each family (tests/lm/lm_models.py FAMILIES, and Llama, the writer's first family) a small random model of
one shape: hidden 256, 4 layers, 8 query heads over 2 KV heads (Gemma 3: 1), head size 32, 2,048 positions, a
512-token window where the family slides (Gemma 2 and 3, Qwen2 and 3, on some layers; Mistral and Phi-3 on all).
Each is imported by `pipe import` (its gate reads 1,024 tokens and decodes across the window), then served by
pipe serve's engine in process (its session made as pipe serve makes it, 2 threads):

- parity: a 1,500-token prompt and one ending 16 tokens before the window, each continued 32 tokens greedily,
  against transformers' `generate` on the same weights;
- speed: 1 and 16 streams of 128-token prompts, 128 new tokens each, all submitted at once: generated tokens
  over the wall time, and the ratio to Llama's written graph at the same load. Every family is timed once a
  round, in an order drawn from one seed each round (pipeline/runtime/rounds.py's reason: a fixed order puts
  each one behind the same neighbour), ROUNDS rounds; the median is kept.

Random weights time the serving and judge parity only. The EOS is the vocabulary's last id, which the
tokenizer never makes, so streams run to their length.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchkit import ROOT, Out, pipe

sys.path.insert(0, str(ROOT))

WINDOW = 512
SHAPE = dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=2, head_dim=32, max_position_embeddings=2048, eos_token_id=319)  # fmt: skip
WINDOWED = {  # what each family's window looks like at this shape
    "gemma3": dict(num_key_value_heads=1, sliding_window=WINDOW,
                   layer_types=["sliding_attention"] * 3 + ["full_attention"]),
    "gemma2": dict(sliding_window=WINDOW),
    "mistral": dict(sliding_window=WINDOW),
    "qwen2": dict(sliding_window=WINDOW, max_window_layers=2),
    "qwen3": dict(sliding_window=WINDOW, max_window_layers=2),
    "phi3": dict(sliding_window=WINDOW),
}  # fmt: skip
PROMPT, NEW = 1500, 32  # the parity case's prompt and new tokens
STREAM_PROMPT, STREAM_NEW = 128, 128
ROUNDS = 5


def make(directory: Path, family: str) -> Path:
    from tests.lm.lm_models import save_family, save_llama

    if family == "llama":
        shape = {k: v for k, v in SHAPE.items() if k != "head_dim"}
        return save_llama(directory, **shape)
    return save_family(directory, family, **(SHAPE | WINDOWED[family]))


def generator(version: Path) -> Any:
    from pipeline.artifact.directory import Artifact
    from pipeline.serve.generation.served import TextGenerator
    from pipeline.serve.generation.settings import GenerationSettings
    from pipeline.serve.session import ModelSession, SessionOptions

    manifest = Artifact.load(version).manifest
    session = ModelSession(version / "model.onnx", SessionOptions("cpu", 2, 1, False), manifest).session
    return TextGenerator.of(version, manifest, session, GenerationSettings(max_sequences=16), None)


def served(gen: Any, prompts: list[list[int]], steps: int) -> tuple[list[list[int]], float]:
    """Every prompt submitted at once; each one's new tokens and the wall time until the last ended."""
    from tests.lm.greedy_runs import engine_greedy

    start = time.perf_counter()
    answers = engine_greedy(gen, prompts, steps)
    return answers, time.perf_counter() - start


def imported_row(work: Path, family: str) -> tuple[dict[str, Any], Any]:
    """One family imported and checked for parity at length; its row and its served generator."""
    import numpy as np

    source = make(work / family, family)
    start = time.perf_counter()
    pipe("import", str(source), "--name", family, "--repository", str(work / "repo"))
    imported_s = time.perf_counter() - start
    version = work / "repo" / family / "1"
    manifest = json.loads((version / "manifest.json").read_text())
    record = manifest["stages"]["import"]
    gen = generator(version)
    from tests.lm.greedy_runs import transformers_greedy

    words = _words(np.random.default_rng(0))
    cases = [words(PROMPT), words(WINDOW - 16)]
    answers, _ = served(gen, cases, NEW)
    equal = [
        answer == transformers_greedy(source, ids, NEW, eos=319) for ids, answer in zip(cases, answers, strict=True)
    ]
    row = {
        "family": family,
        "exporter": re.search(r"\((\w+)\)$", record["notes"][0]).group(1),  # "exported and gated in 8.3 s (fused)"
        "notes": record["notes"][1:],  # a written graph traced instead says why
        "windows": manifest["generation"]["cache"].get("windows"),
        "import_s": round(imported_s, 1),
        "parity_1500": equal[0],
        "parity_across_window": equal[1],
    }
    return row, gen


def _words(rng: Any) -> Any:
    return lambda n: [1, *rng.integers(3, 300, size=n - 1).tolist()]


def timed_rounds(generators: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Each family's tokens/s at 1 and 16 streams: the median of ROUNDS rounds, each in a seeded random order."""
    import numpy as np

    rng = np.random.default_rng(0)
    words = _words(rng)
    seen: dict[str, dict[int, list[float]]] = {name: {1: [], 16: []} for name in generators}
    for _ in range(ROUNDS):
        for name in rng.permutation(sorted(generators)):
            for streams in (1, 16):
                made, seconds = served(generators[name], [words(STREAM_PROMPT) for _ in range(streams)], STREAM_NEW)
                seen[name][streams].append(sum(len(m) for m in made) / seconds)
    return {name: {str(k): round(float(np.median(v)), 1) for k, v in runs.items()} for name, runs in seen.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", default="llama,mistral,qwen2,qwen3,phi3,gemma2,gemma3")
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "families.json")
    args = parser.parse_args()
    out = Out()
    with tempfile.TemporaryDirectory() as tmp:
        made = [imported_row(Path(tmp), family) for family in args.families.split(",")]
        speeds = timed_rounds({row["family"]: gen for row, gen in made})
    rows = [row | {"tokens_per_s": speeds[row["family"]]} for row, _ in made]
    base = next((r["tokens_per_s"] for r in rows if r["family"] == "llama"), None)
    out(f"{'family':8s} {'graph':7s} {'windows':22s} {'1,500 tokens':12s} {'across':7s} "
        f"{'tok/s 1':>8s} {'tok/s 16':>9s} {'vs llama 1':>10s} {'vs llama 16':>11s}")  # fmt: skip
    for r in rows:
        windows = "none" if not r["windows"] else f"{max(r['windows'])} on {sum(1 for w in r['windows'] if w)}/4"
        ratio = [f"{r['tokens_per_s'][k] / base[k]:.2f}x" if base else "-" for k in ("1", "16")]
        out(f"{r['family']:8s} {r['exporter']:7s} {windows:22s} {r['parity_1500']!s:12s} "
            f"{r['parity_across_window']!s:7s} {r['tokens_per_s']['1']:8.1f} {r['tokens_per_s']['16']:9.1f} "
            f"{ratio[0]:>10s} {ratio[1]:>11s}")  # fmt: skip
    args.json.write_text(json.dumps(rows, indent=1) + "\n")
    out(f"written {args.json}")


if __name__ == "__main__":
    main()
