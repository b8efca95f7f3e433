"""The architecture's import rules (pyproject's [tool.importlinter]) hold, and a broken one fails.

`lint-imports` reads the contracts from pyproject.toml in its working directory and the package
from that directory too (it puts the directory first on sys.path), so a copy of the tree with one
forbidden import added is checked on its own, without touching the real one.
"""

from __future__ import annotations

import keyword
import shutil
import subprocess
import sys
import tomllib
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


LAYERS = "commands on stages, every stage alone, shared packages below, the spine at the"  # lint-imports wraps the rest
ARTIFACT_LAYERS = "the artifact's modules in layers: the directory on the manifest"  # wrapped after
OPTIMIZE_LAYERS = "optimize's modules in layers: the stage on the kinds"  # wrapped after
FRAMEWORKS = "pipe serve and the artifact never import a training or conversion framework"


def layered(module: str, line: str, importer: str, imported: str) -> tuple[str, str, str, str]:
    """A case for the layers contract: `line` added to `module` must be refused as importer -> imported."""
    return module, line, LAYERS, f"{importer} is not allowed to import {imported}"


@pytest.mark.parametrize(
    ("module", "line", "contract", "chain"),
    [
        # one stage reaching into another instead of going through the artifact (each passed before issue 21)
        (
            "serve/__init__.py",
            "import pipeline.predict",
            LAYERS,
            "pipeline.serve is not allowed to import pipeline.predict",
        ),
        (
            "check/__init__.py",
            "import pipeline.optimize",
            LAYERS,
            "pipeline.check is not allowed to import pipeline.optimize",
        ),
        (
            "edge/__init__.py",
            "import pipeline.export",
            LAYERS,
            "pipeline.edge is not allowed to import pipeline.export",
        ),
        (
            "predict/__init__.py",
            "import pipeline.train",
            LAYERS,
            "pipeline.predict is not allowed to import pipeline.train",
        ),
        (
            "benchmark/__init__.py",
            "import pipeline.report",
            LAYERS,
            "pipeline.benchmark is not allowed to import pipeline.report",
        ),
        # the spine and the shared packages depending on what stands above them
        (
            "artifact/directory.py",
            "from pipeline.export import metadata",
            LAYERS,
            "pipeline.artifact is not allowed to import pipeline.export",
        ),
        (
            "runtime/runners.py",
            "import pipeline.verify.gate",
            LAYERS,
            "pipeline.runtime is not allowed to import pipeline.verify",
        ),
        (
            "recipe/schema.py",
            "import pipeline.verify.metrics",
            LAYERS,
            "pipeline.recipe is not allowed to import pipeline.verify",
        ),
        # a cycle inside the artifact: a spec or token module reaching up to the manifest or the directory
        (
            "artifact/tensors.py",
            "from pipeline.artifact.manifest import Manifest",
            ARTIFACT_LAYERS,
            "pipeline.artifact.tensors is not allowed to import pipeline.artifact.manifest",
        ),
        (
            "artifact/tokens.py",
            "def _later():\n    from pipeline.artifact.directory import Artifact",
            ARTIFACT_LAYERS,
            "pipeline.artifact.tokens is not allowed to import pipeline.artifact.directory",
        ),
        # a cycle inside optimize: repair reaching up to the search it serves, a trial to the search (issue 27)
        (
            "optimize/repair.py",
            "from pipeline.optimize.search import Search",
            OPTIMIZE_LAYERS,
            "pipeline.optimize.repair is not allowed to import pipeline.optimize.search",
        ),
        (
            "optimize/trial.py",
            "def _later():\n    from pipeline.optimize.speed import Timer",
            OPTIMIZE_LAYERS,
            "pipeline.optimize.trial is not allowed to import pipeline.optimize.speed",
        ),
        # the unit every kind is, reaching up to the list of kinds
        (
            "optimize/kind.py",
            "from pipeline.optimize.kinds import KINDS",
            OPTIMIZE_LAYERS,
            "pipeline.optimize.kind is not allowed to import pipeline.optimize.kinds",
        ),
        # a stage importing the command that runs the chain
        (
            "report/__init__.py",
            "import pipeline.chain",
            LAYERS,
            "pipeline.report is not allowed to import pipeline.chain",
        ),
        # a heavy framework imported lazily inside a function still counts
        ("serve/__init__.py", "def _convert():\n    import torch", FRAMEWORKS, "pipeline.serve -> torch"),
        # the device runner stays stand-alone
        (
            "runtime/tflite_runner.py",
            "import pipeline.core.errors",
            "the stand-alone TFLite runner imports nothing of pipe and no framework",
            "pipeline.runtime.tflite_runner -> pipeline.core.errors",
        ),
        # the ORT training worker runs in its own runtime: nothing of pipe
        (
            "train/ort_worker.py",
            "def _later():\n    import pipeline.data",
            "the ONNX Runtime training worker imports nothing of pipe and no other framework",
            "pipeline.train.ort_worker -> pipeline.data",
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
    assert "BROKEN" in result.stdout and contract in result.stdout, result.stdout
    assert chain in result.stdout, result.stdout


def test_every_package_stands_in_the_layers_and_none_is_optional() -> None:
    """A new package must be placed in the layers before the contracts hold; nothing built is left optional."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c for c in config if c["id"] == "layers")["layers"]
    named = {name.strip() for layer in layers for name in layer.replace(":", "|").split("|")}
    packages = {p.name for p in (ROOT / "pipeline").iterdir() if (p / "__init__.py").is_file()}
    assert not any("(" in layer for layer in layers), layers
    assert named == packages, (
        f"not in the layers: {sorted(packages - named)}; not a package: {sorted(named - packages)}"
    )
    loose = sorted(p.name for p in (ROOT / "pipeline").glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert not loose, f"modules outside a package: {loose}"


def test_every_command_is_in_the_module_named_for_it() -> None:
    """`pipe NAME` is defined in pipeline/cli/NAME.py (`import` in import_.py: a keyword), so a reader finds a
    command from its name; every other module of the package is the group, the shared options or a helper."""
    from pipeline.cli import main

    where = {name: command.callback.__module__ for name, command in main.commands.items()}
    expected = {name: f"pipeline.cli.{name}_" if keyword.iskeyword(name) else f"pipeline.cli.{name}" for name in where}
    assert where == expected
    helpers = {"__init__", "group", "params", "gate_options", "artifact_views"}
    modules = {p.stem for p in (ROOT / "pipeline" / "cli").glob("*.py")} - helpers
    assert modules == {m.rsplit(".", 1)[1] for m in where.values()}, "a module of pipeline/cli/ holds no command"
