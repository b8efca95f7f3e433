"""What the benchmarks share: the environment a `pipe` command runs in, running one, and the printed lines.

Each benchmark is a script (`python bench/NAME.py`), so this file, beside them, is imported as `benchkit`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# `pipe` as a user runs it: this interpreter's environment first on PATH, CI mode (no progress bars).
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}", "CI": "true"}


class Out:
    """Printed lines, kept for the .txt copy."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)


def pipe(*args: str) -> str:
    """A `pipe` command as a user runs it; its output (raises with it on a non-zero exit)."""
    proc = subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, env=ENV,
                          cwd=ROOT)  # fmt: skip
    if proc.returncode:
        raise RuntimeError(f"pipe {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout + proc.stderr
