"""The architecture's import rules (pyproject's [tool.importlinter]) hold, and a broken one fails.

`lint-imports` reads the contracts from pyproject.toml in its working directory and the package
from that directory too (it puts the directory first on sys.path), so a copy of the tree with one
forbidden import added is checked on its own, without touching the real one.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """Run lint-imports on the package under `root` with its pyproject.toml; no cache dir is written."""
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )


def copy_tree(dest: Path) -> Path:
    shutil.copytree(ROOT / "pipeline", dest / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


def test_contracts_hold_on_the_real_tree() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout, result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract", "chain"),
    [
        # a stage reaching into another stage instead of going through the artifact
        (
            "serve/__init__.py",
            "import pipeline.train",
            "pipe serve imports no other stage",
            "pipeline.serve -> pipeline.train",
        ),
        # the artifact depending on a stage: the spine must stay below every stage
        (
            "artifact.py",
            "from pipeline.export import metadata",
            "the artifact and what stages share import no stage",
            "pipeline.artifact -> pipeline.export.metadata",
        ),
        # a heavy framework imported lazily inside a function still counts
        (
            "serve/__init__.py",
            "def _convert():\n    import torch",
            "pipe serve and the artifact never import a training or conversion framework",
            "pipeline.serve -> torch",
        ),
    ],
)
def test_a_forbidden_import_breaks_its_contract(
    tmp_path: Path, module: str, line: str, contract: str, chain: str
) -> None:
    root = copy_tree(tmp_path)
    target = root / "pipeline" / module
    target.write_text(target.read_text() + f"\n{line}  # deliberately forbidden\n")

    result = lint_imports(root)

    assert result.returncode == 1, result.stdout + result.stderr
    assert f"{contract} BROKEN" in result.stdout, result.stdout
    assert chain in result.stdout, result.stdout
