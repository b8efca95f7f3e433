"""Importing the CLI (and so `pipe --help`) must not load the heavy frameworks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "tensorflow", "onnx2tf", "keras", "transformers")
CHECK = "import json, sys, importlib; importlib.import_module(sys.argv[1]); print(json.dumps(sorted(sys.modules)))"


@pytest.mark.parametrize(
    "module",
    ["pipeline.cli", "pipeline.serve", "pipeline.serve.app", "pipeline.artifact.directory", "pipeline.recipe.schema"],
)
def test_module_loads_no_heavy_framework(module: str) -> None:
    proc = subprocess.run([sys.executable, "-c", CHECK, module], capture_output=True, text=True, check=True)
    loaded = set(json.loads(proc.stdout))
    assert not loaded & set(HEAVY), f"{module} imports {sorted(loaded & set(HEAVY))}"


HELP = """
import sys
from pipeline.cli import main
try:
    main(["--help"])
except SystemExit:
    pass
print([m for m in sys.argv[1:] if m in sys.modules])
"""


def test_help_runs_without_heavy_frameworks() -> None:
    proc = subprocess.run([sys.executable, "-c", HELP, *HEAVY], capture_output=True, text=True, check=True)
    assert proc.stdout.strip().endswith("[]"), proc.stdout
