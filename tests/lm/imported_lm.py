"""The tiny random Llama of lm_models.py imported by `pipe import`, made once and cached across test runs.

`pipe import` of it (export, the parity gate, the manifest) is about 20 s of CPU on a quiet machine and
up to 45 s while the suite runs, and the serve tests only read its result. It is built into the test
model cache (`PIPE_TEST_MODELS`, default ~/.cache/pipe-test-models, as tests/corpus.py keeps wheels and
trained_lm.py its trained Llama), keyed by the digest of every module that can change what the import
writes (all of `pipeline/` but the server, which only reads it, and the tests' model maker) and the
installed torch, transformers, tokenizers, onnx and onnxruntime. It is written in a scratch directory
and renamed into place under a lock, so two pytest-xdist workers never race nor see half of it. Tests
get a copy (`imported_llama`): nothing they do reaches the cache.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import tempfile
from importlib.metadata import version
from pathlib import Path

from tests.corpus import cache_root

ROOT = Path(__file__).resolve().parents[2]
NAME = "tiny-llama"
PACKAGES = ("torch", "transformers", "tokenizers", "onnx", "onnxruntime")


SERVER = ("pipeline/serve/", "pipeline/cli/serve.py")  # read what the import wrote, never change it


def _sources() -> list[Path]:
    """What the import depends on: pipeline/ but the server, and the code making the model."""
    code = sorted(p for p in (ROOT / "pipeline").rglob("*.py") if not p.relative_to(ROOT).as_posix().startswith(SERVER))
    return [*code, ROOT / "tests" / "lm" / "lm_models.py", Path(__file__).resolve()]


def _key(context: int) -> str:
    digest = hashlib.sha256(f"context={context}".encode())
    for path in _sources():
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    for package in PACKAGES:
        digest.update(f"{package}=={version(package)}".encode())
    return digest.hexdigest()[:16]


def cached_llama(context: int) -> Path:
    """The cache entry (`source/`: the transformers directory, `artifacts/`: the repository holding
    `tiny-llama/1`), built on first use. Never write into it."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"{NAME}-{context}-{_key(context)}"
    if not (target / ".complete").exists():
        with (root / f".{NAME}.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (target / ".complete").exists():
                _build(root, target, context)
    return target


def imported_llama(into: Path, context: int) -> tuple[Path, Path]:
    """A copy of the cached import under `into`: (the source directory, the repository)."""
    cached = cached_llama(context)
    shutil.copytree(cached / "source", into / "source")
    shutil.copytree(cached / "artifacts", into / "artifacts")
    return into / "source", into / "artifacts"


def _build(root: Path, target: Path, context: int) -> None:
    from click.testing import CliRunner

    from pipeline.cli.group import main
    from tests.lm.lm_models import save_llama

    with tempfile.TemporaryDirectory(dir=root) as scratch:
        work = Path(scratch) / "work"
        source = save_llama(work / "source", max_position_embeddings=context)
        args = ["import", str(source), "--name", NAME, "--repository", str(work / "artifacts")]
        result = CliRunner().invoke(main, args)
        if result.exit_code != 0:
            raise AssertionError(f"pipe import of the test Llama failed:\n{result.output}")
        (work / ".complete").write_text(_key(context))
        shutil.rmtree(target, ignore_errors=True)
        work.rename(target)
