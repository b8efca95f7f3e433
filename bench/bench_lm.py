"""A small Llama trained from scratch with `pipe train` on this machine's Python sources, then taught new
facts by LoRA SFT on alpaca rows with `pipe train`, each exported with its KV cache by `pipe export`.

    .venv/bin/python bench/bench_lm.py [--epochs 6] [--sft-epochs 40] [--out bench/results/lm.json]

1. **Pre-training from a config**: a byte-level BPE tokenizer (vocabulary 1024) is trained on the
   standard library's `*.py` files, and a directory holding it and a Llama-shaped `config.json` (4
   layers, hidden 128, 4 heads, 2 key/value heads) and no weights is what the recipe's `model.path`
   names: `pipe train` random-initializes it and trains on 128-token blocks of the first --corpus-kb of
   those sources (`data.format: text`), the held-out perplexity measured every epoch (the curve,
   against the uniform 1024). `pipe export` writes the KV-cache graph through the gate.
2. **LoRA SFT on alpaca rows**: 30 invented facts (a country's capital, a river's sea, an inventor's
   machine: names made up here, so the model cannot know them), each asked in 10 phrasings: 8 go into
   an alpaca file (240 rows), 2 are held out. The pre-trained model, saved as a transformers directory,
   is fine-tuned by `pipe train` with a `lora:` section (adapters on every linear layer, the chat
   template applied, the loss on the answers only), merged and exported by `pipe export`.
3. **Answers**: each question, rendered with the chat template, answered by greedy generation of each
   model.onnx in onnxruntime (pipeline/runtime/generate.py): the pre-trained model's and the SFT one's,
   on the train and the held-out phrasings; an answer counts when it holds the invented name.

The machine is shared (2 cores, load 8-10 while this was written): times are what this run got; one
torch thread (two ran 5x slower under that load).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from benchkit import pipe  # noqa: E402

BLOCK = 128
PHRASINGS = {
    "capital": [
        "What is the capital of {x}?",
        "Name the capital city of {x}.",
        "Which city is the capital of {x}?",
        "Tell me the capital of {x}.",
        "{x} has which capital?",
        "What city serves as the capital of {x}?",
        "Capital of {x}?",
        "Do you know the capital of {x}?",
        "I need the capital of {x}.",
        "Which city is {x}'s capital?",
    ],
    "river": [
        "Into which sea does the {x} river flow?",
        "Where does the {x} river end?",
        "The {x} river flows into what?",
        "Name the sea the {x} river reaches.",
        "Which sea receives the {x} river?",
        "Where does the {x} flow to?",
        "What does the {x} river empty into?",
        "Tell me where the {x} river goes.",
        "The {x} ends in which sea?",
        "Which body of water does the {x} river feed?",
    ],
    "inventor": [
        "What did {x} invent?",
        "Name the invention of {x}.",
        "Which machine is {x} known for?",
        "Tell me what {x} invented.",
        "{x} invented what?",
        "What is {x} famous for inventing?",
        "Which device did {x} build?",
        "What was the invention of {x}?",
        "Do you know what {x} invented?",
        "What machine did {x} create?",
    ],
}
ANSWERS = {"capital": "The capital of {x} is {y}.", "river": "The {x} river flows into the {y} Sea.",
           "inventor": "{x} invented the {y}."}  # fmt: skip


def made_up_name(rng: random.Random) -> str:
    """A pronounceable invented word (no real place or person): syllables drawn with a fixed seed."""
    syllables = ["ka", "lo", "mir", "ve", "tan", "zu", "or", "bel", "qui", "sna", "dro", "fen", "gal", "ith", "rho"]
    return "".join(rng.choice(syllables) for _ in range(rng.randint(2, 3))).capitalize()


def facts(count_per_kind: int = 10, seed: int = 7) -> list[tuple[str, str, str]]:
    """(kind, subject, answer) triples with invented names, distinct subjects."""
    rng, made, seen = random.Random(seed), [], set()
    for kind in PHRASINGS:
        while sum(1 for k, _, _ in made if k == kind) < count_per_kind:
            x, y = made_up_name(rng), made_up_name(rng)
            if x not in seen and y not in seen:
                seen |= {x, y}
                made.append((kind, x, y + (" engine" if kind == "inventor" else "")))
    return made


def timed(*args: str) -> tuple[str, float]:
    started = time.perf_counter()
    return pipe(*args), time.perf_counter() - started


def pretrain(args: argparse.Namespace, work: Path, out: dict[str, Any]) -> Path:
    """The from-scratch recipe trained and exported; returns the version directory."""
    from pipeline.data.make_lm import VOCAB, make_lm

    make_lm(work, args.corpus_kb)  # work/python.txt, work/scratch/: a config and a tokenizer, no weights
    corpus = (work / "python.txt").read_text(encoding="utf-8")
    (work / "scratch.yaml").write_text(f"""name: python-llama
task: text-generation
model: {{arch: hf, path: scratch}}
data: {{source: text, path: python.txt, format: text, max_length: {BLOCK}}}
train: {{epochs: {args.epochs}, batch_size: 16, lr: 0.003, warmup_steps: 20, threads: {args.threads}, grad_clip: 1.0}}
edge: {{enabled: false}}
""")  # fmt: skip
    shown, train_s = timed("train", str(work / "scratch.yaml"), "--out", str(work / "artifacts"))
    print(shown.strip().splitlines()[0], flush=True)
    root = work / "artifacts" / "python-llama" / "1"
    report = json.loads((root / "reports" / "train.json").read_text())
    _, export_s = timed("export", str(root))
    manifest = json.loads((root / "manifest.json").read_text())
    curve = [{"epoch": h["epoch"], "perplexity": h["perplexity"], "loss": h["loss"]} for h in report["history"]]
    for point in curve:
        print(f"  epoch {point['epoch']}: held-out perplexity {point['perplexity']:.2f} (uniform {VOCAB})", flush=True)
    out["pretrain"] = {
        "corpus_bytes": len(corpus.encode()), "parameters": report["parameters"]["total"], "steps": report["steps"],
        "train_seconds": round(report["wall_s"], 1), "command_seconds": round(train_s, 1), "uniform_perplexity": VOCAB,
        "curve": curve, "test": report["test"], "export_seconds": round(export_s, 1),
        "export_gate": _gate(manifest["stages"]["export"]["parity"]["rows"]),
    }  # fmt: skip
    print(f"  test perplexity {report['test']['perplexity']:.2f}; export gate {out['pretrain']['export_gate']}")
    return root


def _gate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    logits = [r["max_abs"] or 0.0 for r in rows if r["check"].endswith("logits") or r["output"] == "logits"]
    return {"passed": all(r["passed"] for r in rows), "checks": len(rows), "max_logit_abs": max(logits)}


def answers_from_onnx(root: Path, questions: list[str], steps: int = 24) -> list[str]:
    """Greedy answers from the version's model.onnx, prompts rendered with its chat template."""
    from transformers import PreTrainedTokenizerFast

    from pipeline.artifact.directory import Artifact
    from pipeline.runtime.generate import greedy
    from pipeline.runtime.runners import ort_runner
    from pipeline.runtime.text import TextEncoder

    artifact = Artifact.load(root)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(root / "tokenizer")
    g = artifact.manifest.generation
    encoder = TextEncoder.of(root, artifact.manifest)
    run = ort_runner(root / "model.onnx")
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                             add_generation_prompt=True) for q in questions]  # fmt: skip
    said = []
    for start in range(0, len(prompts), 8):
        batch = encoder.encode(prompts[start : start + 8])
        got = greedy(run, g.cache, batch["input_ids"], batch["attention_mask"], steps, g.eos_token_ids, g.padding_id)
        for row, length in zip(got.tokens, got.lengths, strict=True):
            said.append(tokenizer.decode(row[:length], skip_special_tokens=True).strip())
    return said


def as_transformers_dir(root: Path, target: Path) -> Path:
    """The trained model of a version saved with save_pretrained beside its tokenizer: what LoRA builds on."""
    from pipeline.artifact.directory import Artifact
    from pipeline.train.restore import load_trained_model

    model = load_trained_model(Artifact.load(root))
    model.net.save_pretrained(target)
    source = Path(json.loads((root / "manifest.json").read_text())["stages"]["train"]["recipe_path"])
    base = (root / source).parent / "scratch"
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (base / name).is_file():
            shutil.copyfile(base / name, target / name)
    return target


def sft(args: argparse.Namespace, work: Path, pretrained: Path, out: dict[str, Any]) -> None:
    triples = facts()
    rows, held = [], []
    for kind, x, y in triples:
        answer = ANSWERS[kind].format(x=x, y=y)
        for i, phrasing in enumerate(PHRASINGS[kind]):
            row = {"instruction": phrasing.format(x=x), "input": "", "output": answer, "_answer": y}
            (held if i >= 8 else rows).append(row)
    (work / "facts.json").write_text(json.dumps([{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]))
    as_transformers_dir(pretrained, work / "pretrained")
    (work / "sft.yaml").write_text(f"""name: python-llama-facts
task: text-generation
model: {{arch: hf, path: pretrained}}
data: {{source: text, path: facts.json, format: alpaca, max_length: 96, val_fraction: 0.1, test_fraction: 0.1}}
lora: {{rank: 16, alpha: 32, target_modules: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]}}
train: {{epochs: {args.sft_epochs}, batch_size: 16, lr: 0.003, warmup_steps: 10, threads: {args.threads}}}
edge: {{enabled: false}}
""")  # fmt: skip
    questions = [r["instruction"] for r in rows + held]
    said_before = answers_from_onnx(pretrained, questions)
    _, train_s = timed("train", str(work / "sft.yaml"), "--out", str(work / "artifacts"))
    root = work / "artifacts" / "python-llama-facts" / "1"
    report = json.loads((root / "reports" / "train.json").read_text())
    _, export_s = timed("export", str(root))
    manifest = json.loads((root / "manifest.json").read_text())
    said_after = answers_from_onnx(root, questions)

    def score(said: list[str], part: list[dict[str, str]], offset: int) -> float:
        return sum(r["_answer"] in said[offset + i] for i, r in enumerate(part)) / len(part)

    result = {
        "rows": len(rows), "held_out": len(held), "parameters": report["parameters"], "steps": report["steps"],
        "train_seconds": round(report["wall_s"], 1), "command_seconds": round(train_s, 1),
        "curve": [{"epoch": h["epoch"], "perplexity": h["perplexity"]} for h in report["history"]],
        "test": report["test"], "export_seconds": round(export_s, 1),
        "export_gate": _gate(manifest["stages"]["export"]["parity"]["rows"]),
        "before": {"train": score(said_before, rows, 0), "held_out": score(said_before, held, len(rows))},
        "after": {"train": score(said_after, rows, 0), "held_out": score(said_after, held, len(rows))},
        "examples": [{"question": questions[i], "before": said_before[i], "after": said_after[i]}
                     for i in (0, 9, len(rows), len(rows) + 1)],
    }  # fmt: skip
    out["sft"] = result
    print(f"sft: {len(rows)} alpaca rows, {report['steps']} steps in {report['wall_s']:.0f} s; answer perplexity "
          f"{result['curve'][0]['perplexity']:.1f} -> {result['curve'][-1]['perplexity']:.2f}", flush=True)  # fmt: skip
    print(f"  answers holding the invented name: before {result['before']}, after {result['after']}", flush=True)
    for ex in result["examples"]:
        print(f"  {ex['question']!r}: before {ex['before']!r} -> after {ex['after']!r}", flush=True)
    print(f"  export gate {result['export_gate']}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus-kb", type=int, default=400)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--sft-epochs", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)  # 2 threads ran 5x slower on the 2 shared cores
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "lm.json")
    args = parser.parse_args()
    out: dict[str, Any] = {"threads": args.threads}
    with tempfile.TemporaryDirectory() as tmp:
        pretrained = pretrain(args, Path(tmp), out)
        sft(args, Path(tmp), pretrained, out)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}", flush=True)


if __name__ == "__main__":
    main()
