"""A small Llama trained from scratch by `pipe train` and exported by `pipe export`, made once and cached.

Quantization is judged on trained weights only (random weights' top two logits are within 0.01-0.08 of
each other, so any rounding flips them). This is python-llama's recipe at a size the suite affords: the
first 96 KB of the standard library's sources (pipeline/data/make_lm.py: its tokenizer, vocabulary
1024), a Llama of 2 layers, hidden 64, 4 heads / 2 key-value heads, trained 4 epochs on 64-token
blocks. Measured here: about 25 s of training and 20 s of export on one thread, test perplexity about
70 against 1024 for a uniform guess (the tests assert it stays under 150).

The version is built once into the test model cache (`PIPE_TEST_MODELS`, default
~/.cache/pipe-test-models, as tests/corpus.py keeps wheels), keyed by the digest of the code that
makes it and the installed torch and transformers; a lock keeps parallel workers to one build. Tests
copy it (`trained_copy`) before writing into it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import tempfile
from importlib.metadata import version
from pathlib import Path

from tests.corpus import cache_root

ROOT = Path(__file__).resolve().parents[2]
NAME = "tiny-python-llama"
CORPUS_KB = 96
CONFIG = {"hidden_size": 64, "intermediate_size": 192, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "max_position_embeddings": 128}  # fmt: skip
RECIPE = f"""name: {NAME}
task: text-generation
model: {{arch: hf, path: scratch}}
data: {{source: text, path: python.txt, format: text, max_length: 64}}
train: {{epochs: 8, batch_size: 16, lr: 0.005, warmup_steps: 10, grad_clip: 1.0, threads: 1, seed: 0}}
edge: {{enabled: false}}
"""
# what the model depends on: a change to any of these makes another model
SOURCES = [
    "pipeline/data/make_lm.py", "pipeline/data/lm_tokens.py", "pipeline/data/instructions.py",
    "pipeline/data/sources.py", "pipeline/data/splits.py", "pipeline/train/causal_lm.py",
    "pipeline/train/finish_lm.py", "pipeline/train/loop.py", "pipeline/train/objective.py",
    "pipeline/export/causal_lm.py", "pipeline/export/lm_module.py", "pipeline/export/fused_decoder.py",
    "pipeline/runtime/decoder.py",
    "pipeline/runtime/generate.py", "pipeline/artifact/generation.py", "tests/lm/trained_lm.py",
]  # fmt: skip


def _key() -> str:
    digest = hashlib.sha256()
    for rel in SOURCES:
        digest.update(rel.encode() + b"\0" + (ROOT / rel).read_bytes())
    for package in ("torch", "transformers", "tokenizers", "onnxruntime"):
        digest.update(f"{package}=={version(package)}".encode())
    return digest.hexdigest()[:16]


def trained_version() -> Path:
    """The cached version directory (`.../artifacts/tiny-python-llama/1`), built on first use. Never write into it."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"{NAME}-{_key()}"
    done = target / ".complete"
    if not done.exists():
        with (root / f".{NAME}.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not done.exists():
                _build(root, target)
    return target / "artifacts" / NAME / "1"


def trained_copy(into: Path) -> Path:
    """A copy of the trained version under `into` (`into/tiny-python-llama/1`), to optimize or check."""
    dst = into / NAME / "1"
    shutil.copytree(trained_version(), dst)
    return dst


def _build(root: Path, target: Path) -> None:
    from click.testing import CliRunner

    from pipeline.cli.group import main
    from pipeline.data.make_lm import python_sources, save_scratch_llama

    with tempfile.TemporaryDirectory(dir=root) as scratch:
        work = Path(scratch) / "work"
        work.mkdir()
        text = python_sources(CORPUS_KB)
        (work / "python.txt").write_text(text, encoding="utf-8")
        save_scratch_llama(work / "scratch", text)
        config_file = work / "scratch" / "config.json"
        config_file.write_text(json.dumps(json.loads(config_file.read_text()) | CONFIG, indent=2))
        (work / "lm.yaml").write_text(RECIPE)
        runner = CliRunner()
        for args in (["train", str(work / "lm.yaml"), "--out", str(work / "artifacts")],
                     ["export", str(work / "artifacts" / NAME / "1")]):  # fmt: skip
            result = runner.invoke(main, args)
            if result.exit_code != 0:
                raise AssertionError(f"pipe {args[0]} of the test LM failed:\n{result.output}")
        (work / ".complete").write_text(_key())
        shutil.rmtree(target, ignore_errors=True)
        work.rename(target)
